"""What every ``concord`` command shares: how it answers, opens stores, and reads its arguments.

A command is ``cmd_x(args, out) -> int``: ``args`` is the parsed command line, ``out`` an
:class:`Output` through which it emits its one result and reports progress; it returns the exit
status. The noun modules (``snapshots``, ``lineage``, ``federate``, ``tier``, ``audit``) import
this module and the core, never one another. Only the standard library is imported here, so
building the parser (``concord --help``) loads no heavy library.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property

from concord.home import patched_environ

STORE_HELP = "a folder, file:///path, s3://bucket/prefix or block:NAME"
TRUST_HELP = (
    "trusted public keys: comma-separated PEM paths and block:NAME (a saved Concord Trust block) entries, or one POLICY.yaml "
    "(keys: by name, threshold: K) (default: $CONCORD_TRUSTED_KEYS)"
)
TRUST_THRESHOLD_HELP = (
    "how many distinct trusted keys must have signed (default: the policy file's or block's threshold, "
    "else $CONCORD_TRUST_THRESHOLD, else 1)"
)
TRACKING_URI_HELP = "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite in $CONCORD_HOME)"
REGISTRY_HELP = "store of data snapshots and contracts (default: $CONCORD_REGISTRY, else $CONCORD_HOME/registry)"

# ----------------------------------------------------------------------------- answering


def add_trust_threshold(parser: argparse.ArgumentParser) -> None:
    """Give every command of ``parser`` (and its subcommands) that takes ``--trust`` a
    ``--trust-threshold K`` beside it, so every consumer of a trust policy reads K the same way."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                add_trust_threshold(child)
    if "--trust" in parser._option_string_actions and "--trust-threshold" not in parser._option_string_actions:
        parser.add_argument("--trust-threshold", type=positive_int, metavar="K", help=TRUST_THRESHOLD_HELP)


def resolve_trust(args: argparse.Namespace) -> None:
    """With ``--trust-threshold K``, replace ``args.trust`` by the policy it makes (``--trust``
    or ``$CONCORD_TRUSTED_KEYS`` needing K keys), resolved before any store is opened; the text
    given stays in ``args.trust_spec``."""
    args.trust_spec = getattr(args, "trust", None)
    threshold = getattr(args, "trust_threshold", None)
    if threshold is not None:
        from concord.trust import load_policy

        args.trust = load_policy(args.trust, threshold=threshold)


class Output:
    """How a command answers: :meth:`emit` its result, report its work through :attr:`progress`.

    With ``--json`` the result is exactly one JSON object on stdout and there are no bars;
    otherwise readable lines, and byte-counting bars on a terminal's stderr."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    def emit(self, payload: dict, lines: list[str]) -> None:
        """Print ``payload`` as one JSON object (``--json``), or ``lines`` for a person.

        Every human line goes through :func:`concord.text.printable`: a file name, ref message or
        column name holding a newline or a terminal escape is shown escaped, never obeyed."""
        if self.json:
            sys.stdout.write(json.dumps(payload, sort_keys=True) + "\n")
        else:
            from concord.text import printable

            sys.stdout.write("\n".join(printable(line) for line in lines) + "\n")

    @cached_property
    def progress(self):
        """The command's progress reporter, made on first use: nothing with ``--json``."""
        if self.json:
            from concord.progress import NullProgress

            return NullProgress()
        from concord.progress import TqdmProgress

        return TqdmProgress()


def fail(message: object) -> int:
    """The CLI's one error printer: ``concord: error: MESSAGE`` as one bounded line on stderr
    (:func:`concord.text.one_line`); returns the exit status: a Concord error's ``exit_code``
    (its kind: 10 not found, 11 locked, 12 wrong key, 13 untrusted, 14 unreachable, 15 damaged
    data), else 1."""
    from concord.errors import ConcordError
    from concord.redact import redact
    from concord.text import one_line

    # a library's error may show an endpoint's password: hidden here whatever raised it
    print(f"concord: error: {one_line(redact(message))}", file=sys.stderr)
    return message.exit_code if isinstance(message, ConcordError) else 1


def human(n: float) -> str:
    """A byte count for a person: ``512 B``, ``4.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ----------------------------------------------------------------------------- stores and MLflow


def writable_store(spec: str):
    """A store a command writes to (a folder that is not there yet is created)."""
    from concord.stores import open_store

    return open_store(spec)


def readable_store(spec: str):
    """A store for a command that only reads: never created; a path holding no store is an error."""
    from concord.stores import open_store_to_read

    return open_store_to_read(spec)


def peek_store(spec: str):
    """A store looked into without creating it: a folder that is not there reads as empty."""
    from concord.stores import open_store

    return open_store(spec, create=False)


def quiet_mlflow() -> None:
    """MLflow prints run URLs on stdout, which must hold nothing but our output (one JSON object)."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def open_lineage(tracking_uri: str | None):
    """Lineage in MLflow at ``tracking_uri`` (None: :func:`concord.home.default_tracking_uri`)."""
    from concord.lineage import Lineage

    quiet_mlflow()
    return Lineage(tracking_uri)


def keyed_store(store, key_file: str | None, option: str):
    """``store`` with its own key: read from ``key_file`` (given as ``option``, e.g.
    ``--target-key-file``), else the one every store takes (``--key-file``, ``$CONCORD_KEY_FILE``).
    The key is checked at once, so a command that opens two stores names, in one line, the store
    whose key is missing or wrong and the option that gives it, before anything is read or written.
    A store that is not encrypted needs no key and ignores one."""
    from concord.errors import StoreKeyError, StoreKeyFileError
    from concord.stores.cipher import read_key_file

    if key_file:
        try:
            store.unlock(read_key_file(key_file))
        except StoreKeyFileError as exc:
            raise StoreKeyFileError(exc.path, f"{option}: {exc.problem}") from None
    try:
        store.encoding()
    except StoreKeyError as exc:
        given = f"the key from {option} {key_file}" if key_file else "the key of --key-file / $CONCORD_KEY_FILE"
        problem = exc.problem.replace("the key given", given) if "the key given" in exc.problem else exc.problem
        fix = f"Give its key file with {option} FILE (or --key-file FILE / CONCORD_KEY_FILE for every store)"
        raise StoreKeyError(exc.store, problem, fix) from None
    return store


def key_file_options(parser, *stores: tuple[str, str]) -> None:
    """``--X-key-file FILE`` for each ``(X, what)`` store a command opens besides its first."""
    for name, what in stores:
        parser.add_argument(
            f"--{name}-key-file",
            metavar="FILE",
            help=f"the key of {what}, when encrypted (default: --key-file, else $CONCORD_KEY_FILE); never printed",
        )


# ----------------------------------------------------------------------------- argument types


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of 1 or more")
    return value


def whole_number(text: str) -> int:
    """A whole number of 0 or more (a training step, a number of ULPs)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of 0 or more")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number")
    return value


def chunk_size(text: str) -> int:
    """``4194304``, ``4M``, ``512K``, ``1.5MiB`` → bytes; anything else (``infM``, ``nanK``,
    ``1e400``, ``-4M``) is refused in one line."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    problem = f"{text!r} is not a size; write e.g. 4194304, 4M or 512K"
    try:
        if t and t[-1] in units:
            number = float(t[:-1])
            if not math.isfinite(number) or not math.isfinite(number * units[t[-1]]):
                raise argparse.ArgumentTypeError(problem)
            return int(number * units[t[-1]])
        return int(t)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(problem) from None


def name_arg(what: str, hint: str = "; to give none, leave the option out") -> Callable[[str], str]:
    """An argparse type for a ref or root given explicitly: an empty or blank one is refused
    (``--ref ""`` would otherwise quietly mean "no ref")."""

    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r} is {'blank' if text else 'empty'}: give a {what}{hint}")
        return text

    check.__name__ = what.replace(" ", "_")
    return check


ref_arg = name_arg("ref name ([namespace/]name)")
root_arg = name_arg("64-hex snapshot root")
ref_positional = name_arg("ref name ([namespace/]name)", "")


def tracking_parent() -> argparse.ArgumentParser:
    """``--tracking-uri``, for the commands that talk to MLflow."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--tracking-uri", help=TRACKING_URI_HELP)
    return p


def track_parent(what: str, like: str) -> argparse.ArgumentParser:
    """``--track``: also log ``what`` to MLflow as one run, as ``like`` does (with ``--tracking-uri``
    from :func:`tracking_parent`)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--track", action="store_true", help=f"also log the {what} to MLflow as one run, as {like} does")
    return p


def registry_parent() -> argparse.ArgumentParser:
    """``--registry``, for the commands that read or write data snapshots and contracts."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--registry", help=REGISTRY_HELP)
    return p


class Parser(argparse.ArgumentParser):
    """argparse, but a wrong command line is one line on stderr (exit 2), not a usage block."""

    def error(self, message: str):
        from concord.text import one_line

        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} --help`)\n")


# ----------------------------------------------------------------------------- quiet libraries

#: set for the duration of a command, before Prefect or MLflow is imported (restored afterwards)
QUIET_ENV = {
    # ``block:NAME`` without PREFECT_API_URL: Prefect starts a temporary server for the lookup,
    # whose telemetry heartbeat logs an error, or a long traceback, on this command's stderr
    # when it cannot be sent. Forced off: that server lives only as long as the command.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
QUIET_DEFAULTS = {
    "DO_NOT_TRACK": "1",  # Prefect's client-side usage events (and their first-run notice)
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # MLflow's INFO lines (database set-up of a sqlite tracking URI)
}


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """The libraries a command may load print nothing of their own on its stderr: a command
    answers with its output and, on failure, one ``concord: error:`` line. A value the user set
    for ``DO_NOT_TRACK`` or ``MLFLOW_LOGGING_LEVEL`` is kept."""
    import logging

    values = dict(QUIET_ENV, **{k: v for k, v in QUIET_DEFAULTS.items() if k not in os.environ})
    # a block read from Prefect's temporary server leaves its "loaded" event to be sent as the
    # command exits, and Prefect's events worker says "Still processing items" meanwhile
    logging.getLogger("EventsWorker").setLevel(logging.ERROR)
    with patched_environ(values):
        yield
