"""The base of every Concord error."""

from __future__ import annotations

from typing import Any, cast

#: the exit status of the ``concord`` CLI for an error of no more particular kind
EXIT_GENERIC = 1


class ConcordError(Exception):
    """Base of every error raised by Concord. A credential in a URL of its message
    (``http://user:secret@host``) is hidden (:func:`concord.redact.redact`).

    ``exit_code`` is the ``concord`` CLI's exit status for the error's kind (see the README's
    "Exit codes"): 1 generic, 10 not found, 11 locked or busy, 12 wrong key or password,
    13 untrusted, 14 unreachable, 15 damaged data.

    Every subclass survives a pickle round-trip (a task runner such as Dask pickles what a worker
    raised): it is rebuilt from its arguments and attributes without calling its ``__init__``, and
    any credential in them stays hidden."""

    exit_code: int = EXIT_GENERIC

    def __init__(self, *args: object) -> None:
        from concord.redact import redact

        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))

    def __reduce__(self) -> tuple[Any, tuple[type[BaseException], tuple[object, ...], dict[str, object]]]:
        from concord.redact import redact

        def hide(value: object) -> object:
            return redact(value) if isinstance(value, str) else value

        args = tuple(hide(a) for a in self.args)
        state = {k: hide(v) for k, v in self.__dict__.items()}
        return _rebuild, (type(self), args, state)


def _rebuild(cls: type[BaseException], args: tuple[object, ...], state: dict[str, object]) -> BaseException:
    """An instance of ``cls`` with these ``args`` and attributes, made without its ``__init__``."""
    # the first builtin base whose layout the class has (OSError's when it mixes in KeyError too)
    bases: list[Any] = [b for b in cls.__mro__ if b.__module__ == "builtins"]  # BaseException, object, …
    for base in bases:
        try:
            exc = cast(BaseException, base.__new__(cls, *args))  # a builtin base of cls: an instance of cls
            break
        except TypeError:
            continue
    exc.args = args
    exc.__dict__.update(state)
    return exc
