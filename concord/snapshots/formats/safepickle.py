"""Read the *shape* of a pickle without running it: an opcode walk, never ``pickle.load``.

A pickle is a program: ``GLOBAL os system`` then ``REDUCE`` calls ``os.system`` when the
pickle is loaded. Checkpoints are pickles (``data.pkl`` in a ``torch.save`` archive, a DCP
``.metadata``), and a checkpoint is not trusted code, so Concord never loads one. Instead
:func:`read` walks the opcodes with :func:`pickletools.genops` (a parser, which executes
nothing) and keeps a symbolic stack: plain values (str, int, float, bytes, None, bool, tuple,
list, dict) are built as they are, and everything that would import or call something becomes
an inert record: :class:`Global` (a name, never imported), :class:`Call` (what ``REDUCE``,
``NEWOBJ``, ``OBJ`` or ``INST`` would have called, with its arguments, and the state ``BUILD``
would have set), :class:`PersId` (a persistent id: a ``torch.save`` storage). The caller reads
names, dtypes and shapes off that tree.

Anything the walk cannot follow (an extension code, out-of-band buffers, a stack that does not
add up, an unhashable dict key, tuples nested too deep to hash safely) raises :class:`~concord.snapshots.formats.common.Unreadable`.
The tree holds at most one object per opcode, so its size is bounded by the pickle's.
"""

from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass
from typing import Any

from concord.snapshots.formats.common import Unreadable

#: the largest pickle read (a state dict of 100,000 tensors pickles to about 20 MB)
MAX_PICKLE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Global:
    """``module.name`` as the pickle spells it; never imported."""

    module: str
    name: str


class Call:
    """What loading would have called: ``func(*args)``, then ``BUILD`` with ``state``, then
    ``SETITEMS``/``APPENDS`` into the result (``items``). Hashed by identity, as objects are."""

    __slots__ = ("args", "func", "items", "state")

    def __init__(self, func: Any, args: Any) -> None:
        self.func = func
        self.args = args
        self.state: Any = None
        self.items: list = []

    def attrs(self) -> dict:
        """The state ``BUILD`` gave, as a dict (dict state, or ``(dict, slots)`` merged)."""
        s = self.state
        if isinstance(s, dict):
            return s
        if isinstance(s, tuple) and len(s) == 2:
            out: dict = {}
            for half in s:
                if isinstance(half, dict):
                    out.update(half)
            return out
        return {}


class PersId:
    """A persistent id (``torch.save`` refers to each storage this way)."""

    __slots__ = ("pid",)

    def __init__(self, pid: Any) -> None:
        self.pid = pid


_SCALARS = frozenset(
    [
        "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
        "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
        "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    ]
)
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_EMPTY = {"EMPTY_DICT": dict, "EMPTY_LIST": list, "EMPTY_SET": set}
#: how deep tuples may nest (a checkpoint's go a few levels; hashing a deeper one could overflow the C stack)
MAX_NESTING = 64
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}
_PUTS = frozenset(["PUT", "BINPUT", "LONG_BINPUT"])
_GETS = frozenset(["GET", "BINGET", "LONG_BINGET"])


def read(data: bytes) -> Any:
    """The symbolic value of the pickle ``data`` (see the module docstring); executes nothing."""
    if len(data) > MAX_PICKLE_BYTES:
        raise Unreadable(f"pickle of {len(data)} bytes is over the {MAX_PICKLE_BYTES}-byte limit")
    return read_next(io.BytesIO(data))


def read_next(buf: io.BytesIO) -> Any:
    """The symbolic value of the pickle at ``buf``'s position, leaving ``buf`` just after its
    ``STOP`` (a file of several pickles in a row is read one by one); executes nothing.

    On :class:`Unreadable`, ``buf``'s position tells how far the walk got: at the end of ``buf``
    when the pickle merely runs on past the bytes given.
    """
    try:
        return _walk(buf)
    except Unreadable:
        raise
    except (ValueError, IndexError, KeyError, TypeError, RecursionError, UnicodeError, AttributeError) as exc:
        raise Unreadable(f"pickle cannot be followed: {type(exc).__name__}: {exc}") from None


def _walk(data: io.BytesIO) -> Any:
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    nesting: dict[int, int] = {}  # id of each tuple and frozenset built holding another → how deep it nests

    def frozen(kind: type, items) -> Any:
        """A tuple or frozenset, refused when it nests too deep to hash (hashing recurses in C)."""
        depth = 1
        for x in items:
            t = type(x)
            if t is tuple or t is frozenset:
                d = nesting.get(id(x), 1) + 1
                if d > depth:
                    depth = d
        if depth > MAX_NESTING:
            raise Unreadable(f"tuples nested over {MAX_NESTING} deep")
        value = kind(items)
        if depth > 1:
            nesting[id(value)] = depth
        elif nesting:
            nesting.pop(id(value), None)  # an id a freed deeper tuple had
        return value

    def pop_mark() -> list:
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        # the opcodes a state dict is made of most come first
        if name in _PUTS:
            memo[arg] = stack[-1]
        elif name in _GETS:
            stack.append(memo[arg])
        elif name in _SCALARS:
            stack.append(arg)
        elif name == "MARK":
            marks.append(len(stack))
        elif name in _TUPLES:
            n = _TUPLES[name]
            if len(stack) < n:
                raise Unreadable(f"{name} on a stack of {len(stack)}")
            items = frozen(tuple, stack[len(stack) - n :])
            del stack[len(stack) - n :]
            stack.append(items)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name == "EMPTY_TUPLE":
            stack.append(frozen(tuple, ()))
        elif name in _EMPTY:
            stack.append(_EMPTY[name]())
        elif name in ("PROTO", "FRAME"):
            continue
        elif name == "STOP":
            if len(stack) != 1 or marks:
                raise Unreadable("pickle stack does not end with one value")
            return stack[0]
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            pop_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "TUPLE":
            stack.append(frozen(tuple, pop_mark()))
        elif name == "LIST":
            stack.append(pop_mark())
        elif name == "DICT":
            items = pop_mark()
            stack.append(_pairs_into({}, items))
        elif name == "FROZENSET":
            stack.append(frozen(frozenset, pop_mark()))
        elif name == "APPEND":
            value = stack.pop()
            _extend(stack[-1], [value])
        elif name == "APPENDS":
            items = pop_mark()
            _extend(stack[-1], items)
        elif name == "SETITEM":
            value = stack.pop()
            key = stack.pop()
            _setitems(stack[-1], [key, value])
        elif name == "SETITEMS":
            items = pop_mark()
            _setitems(stack[-1], items)
        elif name == "ADDITEMS":
            items = pop_mark()
            target = stack[-1]
            if not isinstance(target, set):
                raise Unreadable("ADDITEMS into something that is not a set")
            target.update(frozen(tuple, items))
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            stack.append(Global(module, attr))
        elif name == "STACK_GLOBAL":
            attr = stack.pop()
            module = stack.pop()
            if not isinstance(module, str) or not isinstance(attr, str):
                raise Unreadable("STACK_GLOBAL of something that is not a name")
            stack.append(Global(module, attr))
        elif name == "INST":
            module, _, attr = str(arg).partition(" ")
            stack.append(Call(Global(module, attr), tuple(pop_mark())))
        elif name == "OBJ":
            items = pop_mark()
            if not items:
                raise Unreadable("OBJ with nothing to call")
            stack.append(Call(items[0], tuple(items[1:])))
        elif name in ("REDUCE", "NEWOBJ"):
            args = stack.pop()
            func = stack.pop()
            stack.append(Call(func, args))
        elif name == "NEWOBJ_EX":
            kwargs = stack.pop()
            args = stack.pop()
            cls = stack.pop()
            stack.append(Call(cls, (args, kwargs)))
        elif name == "BUILD":
            state = stack.pop()
            target = stack[-1]
            if not isinstance(target, Call):
                raise Unreadable("BUILD on something that is not an object")
            target.state = state
        elif name == "PERSID":
            stack.append(PersId(arg))
        elif name == "BINPERSID":
            stack.append(PersId(stack.pop()))
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        else:  # EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER, and any opcode of a later protocol
            raise Unreadable(f"pickle opcode {name} is not followed")
    raise Unreadable("pickle ends without STOP")


def _pairs_into(target: dict, items: list) -> dict:
    if len(items) % 2:
        raise Unreadable("odd number of items for a dict")
    for i in range(0, len(items), 2):
        target[items[i]] = items[i + 1]  # TypeError for an unhashable key: unreadable
    return target


def _setitems(target: Any, items: list) -> None:
    if isinstance(target, dict):
        _pairs_into(target, items)
    elif isinstance(target, Call):  # an OrderedDict() or a dict subclass being filled
        if len(items) % 2:
            raise Unreadable("odd number of items for a dict")
        target.items.extend(zip(items[0::2], items[1::2]))
    else:
        raise Unreadable("SETITEMS into something that is not a dict")


def _extend(target: Any, items: list) -> None:
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, Call):
        target.items.extend(items)
    else:
        raise Unreadable("APPENDS into something that is not a list")
