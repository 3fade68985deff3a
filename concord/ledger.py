"""The federation ledger: one hash-chained record per round, per tenant.

Layout, in any store::

    ledger/<tenant>/<round:06d>.json   one round: its number, tenant, time, the hash of the round
                                       before (``prev``, null for the first), the caller's fields
                                       (method, weights, inputs, result, metrics) and ``hash``
    refs/<tenant>/_ledger              the head: the hash of the newest round (its history lists
                                       every round's hash, in order)

``hash`` is BLAKE3 of the canonical JSON of every other field, so editing any field of a round,
removing or reordering rounds, or copying a round in from another tenant's ledger breaks either a
round's own hash, the ``prev`` chain, the numbering or the head, and :func:`verify_ledger` names
which. The ledger makes tampering evident; it does not stop someone who can write the store.

Appending is safe under concurrency: the round's document is written only if no document holds
that number yet (two rounds racing for one number: one wins, the other gets
:class:`~concord.errors.LedgerConflictError` and writes nothing), then the head moves by
compare-and-swap. A run stopped between those two writes leaves a complete round just past the
head; the next append adopts it (its hash and ``prev`` checked) before adding its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from concord.errors import InvalidNameError, LedgerConflictError, LedgerError, RefConflictError
from concord.hashing import canonical_json
from concord.stores.base import Store, validate_segment

LEDGER_FORMAT = "concord/ledger-round@1"
#: the ref (in the tenant's namespace) holding the hash of the newest round
HEAD_NAME = "_ledger"
#: fields every round has, set by :func:`append_round` (a record may not carry them)
RESERVED = ("format", "round", "tenant", "time", "prev", "hash")

_ROUND_FILE = re.compile(r"^(\d{6})\.json$")
_ADOPT_ATTEMPTS = 3


def validate_tenant(name: str) -> str:
    """``name`` if it can name a tenant: one path segment of letters, digits, ``.``, ``_`` or
    ``-``, not starting with ``.`` (so never ``..``, ``a/b`` or an empty name)."""
    if isinstance(name, str) and name.endswith("\n"):  # a regex's ``$`` lets one trailing newline through
        raise InvalidNameError(name, "tenant name")
    return validate_segment(name, "tenant name")


def ledger_prefix(tenant: str) -> str:
    return f"ledger/{validate_tenant(tenant)}"


def round_key(tenant: str, number: int) -> str:
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 999_999:
        raise ValueError(f"round number {number!r}: rounds are numbered 1 to 999999")
    return f"{ledger_prefix(tenant)}/{number:06d}.json"


def head_ref(tenant: str) -> str:
    return f"{validate_tenant(tenant)}/{HEAD_NAME}"


def round_hash(doc: dict) -> str:
    """BLAKE3 of the canonical JSON of every field of ``doc`` but ``hash``."""
    from blake3 import blake3

    return blake3(canonical_json({k: v for k, v in doc.items() if k != "hash"})).hexdigest()


def read_head(store: Store, tenant: str) -> str | None:
    ref = store.read_ref(head_ref(tenant))
    return ref.root if ref is not None else None


def _round_number(key: str, tenant: str) -> int | None:
    """The round number a document key names, or None if it is not a round of ``tenant``'s."""
    prefix = ledger_prefix(tenant) + "/"
    if not key.startswith(prefix):
        return None
    m = _ROUND_FILE.match(key[len(prefix):])
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def _load(store: Store, key: str) -> dict:
    data = store.get_document(key)
    if data is None:
        raise LedgerError(f"{store.uri}/{key}", "the round's document disappeared while it was being read")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise LedgerError(f"{store.uri}/{key}", f"not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise LedgerError(f"{store.uri}/{key}", "not a JSON object")
    return doc


def list_rounds(store: Store, tenant: str) -> list[dict]:
    """Every round document of ``tenant`` in ``store``, by round number (as stored: not verified;
    see :func:`verify_ledger`)."""
    numbered = []
    for key in store.list_documents(ledger_prefix(tenant)):
        n = _round_number(key, tenant)
        if n is not None:
            numbered.append((n, key))
    return [_load(store, key) for _, key in sorted(numbered)]


def _prepare(tenant: str, record: dict) -> dict:
    if not isinstance(record, dict):
        raise LedgerError(f"ledger of {tenant!r}", f"a round's record must be a dict, got {type(record).__name__}")
    clash = sorted(set(record) & set(RESERVED))
    if clash:
        raise LedgerError(
            f"ledger of {tenant!r}",
            f"the record sets {', '.join(clash)}, which the ledger sets itself",
            "Rename those fields.",
        )
    try:  # round-trip through JSON: what is hashed is exactly what a reader will get back
        return json.loads(json.dumps(record, allow_nan=False, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise LedgerError(
            f"ledger of {tenant!r}", f"the record is not plain JSON ({exc})", "Pass str, int, finite float, bool, None, list and dict values."
        ) from exc


def _tip(store: Store, tenant: str) -> tuple[int, str | None, dict | None]:
    """(number of the newest round, its hash, the round if it was just adopted), after adopting a
    round whose append was stopped between writing its document and moving the head. Raises
    :class:`LedgerError` when the documents and the head disagree in any other way."""
    where = f"ledger of {tenant!r} in {store.uri}"
    for _ in range(_ADOPT_ATTEMPTS):
        head = read_head(store, tenant)
        rounds = list_rounds(store, tenant)
        last = rounds[-1] if rounds else None
        if last is None:
            if head is None:
                return 0, None, None
            raise LedgerError(where, f"the head names round hash {head[:12]} but no round document is there")
        number = last.get("round")
        if not isinstance(number, int) or number != len(rounds):
            raise LedgerError(where, f"the rounds are not numbered 1 to {len(rounds)}")
        if last.get("hash") == head and round_hash(last) == head:
            return number, head, None
        before_ok = head is None if number == 1 else (rounds[-2].get("hash") == head == round_hash(rounds[-2]))
        pending = before_ok and last.get("prev") == head and last.get("hash") == round_hash(last) and last.get("tenant") == tenant
        if pending:
            try:
                store.cas_ref(head_ref(tenant), head, last["hash"], f"round {number} (adopted)")
            except RefConflictError:
                continue  # the head moved meanwhile: look again
            return number, last["hash"], last
        if read_head(store, tenant) != head:
            continue  # a concurrent append moved the head between our two reads
        raise LedgerError(
            where,
            f"the head ({head[:12] if head else 'none'}) does not match round {number} "
            f"(hash {str(last.get('hash'))[:12]})",
        )
    raise LedgerError(where, "the ledger kept changing while it was read", "Re-run when other rounds of this tenant have finished.")


def append_round(store: Store, tenant: str, record: dict) -> dict:
    """Append a round with the caller's fields ``record`` to ``tenant``'s ledger in ``store``.

    Returns the round's document (``round``, ``tenant``, ``time``, ``prev``, the record's fields,
    ``hash``). Raises :class:`~concord.errors.LedgerConflictError` when another round took this
    number first (nothing of this one is kept), :class:`~concord.errors.LedgerError` for a bad
    record or a ledger that does not verify.
    """
    validate_tenant(tenant)
    fields = _prepare(tenant, record)
    number, prev, adopted = _tip(store, tenant)
    if adopted is not None and {k: v for k, v in adopted.items() if k not in RESERVED} == fields:
        # our own earlier attempt, stopped after its document was written (e.g. a retry after the
        # head update failed on the network): that round is this one, not a new one
        return adopted
    doc = {
        "format": LEDGER_FORMAT,
        "round": number + 1,
        "tenant": tenant,
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "prev": prev,
        **fields,
    }
    doc["hash"] = round_hash(doc)
    key = round_key(tenant, doc["round"])
    if not store.put_document(key, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", overwrite=False):
        raise LedgerConflictError(store.uri, tenant, doc["round"], prev, read_head(store, tenant))
    try:
        store.cas_ref(head_ref(tenant), prev, doc["hash"], f"round {doc['round']}")
    except RefConflictError as exc:
        raise LedgerConflictError(store.uri, tenant, doc["round"], prev, exc.actual) from exc
    return doc


@dataclass(frozen=True)
class LedgerReport:
    """What :func:`verify_ledger` found: ``ok`` only when ``problems`` is empty."""

    tenant: str
    store: str
    ok: bool
    rounds: int
    head: str | None
    problems: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {
            "tenant": self.tenant,
            "store": self.store,
            "ok": self.ok,
            "rounds": self.rounds,
            "head": self.head,
            "problems": list(self.problems),
        }


def verify_ledger(store: Store, tenant: str) -> LedgerReport:
    """Check ``tenant``'s ledger in ``store``: every round's own hash, its tenant and number, the
    ``prev`` chain from the first round to the last, and the head (and its history) against the
    rounds. Every problem found is listed; nothing is changed."""
    validate_tenant(tenant)
    problems: list[str] = []
    prefix = ledger_prefix(tenant)
    docs: dict[int, dict] = {}
    for key in store.list_documents(prefix):
        n = _round_number(key, tenant)
        if n is None:
            problems.append(f"{key}: not a round document (expected {prefix}/NNNNNN.json)")
            continue
        try:
            docs[n] = _load(store, key)
        except LedgerError as exc:
            problems.append(f"round {n}: unreadable ({exc.problem})")
            docs[n] = {}
    numbers = sorted(docs)
    for missing in sorted(set(range(1, (numbers[-1] if numbers else 0) + 1)) - set(numbers)):
        problems.append(f"round {missing}: missing (removed from the ledger)")

    hashes: dict[int, str] = {}  # the hash each round's content really has
    for n in numbers:
        doc = docs[n]
        if not doc:
            continue
        actual = round_hash(doc)
        hashes[n] = actual
        if doc.get("format") != LEDGER_FORMAT:
            problems.append(f"round {n}: unknown format {doc.get('format')!r}")
        if doc.get("tenant") != tenant:
            problems.append(f"round {n}: belongs to tenant {doc.get('tenant')!r} (copied from another ledger)")
        if doc.get("round") != n:
            problems.append(f"round {n}: its document says round {doc.get('round')!r} (rounds moved or reordered)")
        if doc.get("hash") != actual:
            problems.append(f"round {n}: edited (its content hashes to {actual[:12]}, it records {str(doc.get('hash'))[:12]})")

    previous: str | None = None  # the real hash of the round before
    for i, n in enumerate(numbers):
        doc = docs[n]
        # a ledger that does not start at round 1 is reported as missing rounds above
        if doc and (i > 0 or n == 1) and doc.get("prev") != previous:
            before = f"round {numbers[i - 1]}'s hash {str(previous)[:12]}" if i else "null (it is the first round)"
            problems.append(f"round {n}: prev is {str(doc.get('prev'))[:12]}, expected {before} (chain broken)")
        previous = hashes.get(n)

    ref = store.read_ref(head_ref(tenant))
    head = ref.root if ref is not None else None
    last = numbers[-1] if numbers else None
    if last is None:
        if head is not None:
            problems.append(f"head {head[:12]} names a round, but the ledger holds none (rounds removed)")
    elif head is None:
        problems.append(f"no head ref {head_ref(tenant)}: the rounds are not anchored (head removed)")
    elif head != hashes.get(last):
        covered = [n for n, h in hashes.items() if h == head]
        if covered:
            problems.append(f"head is round {covered[0]}'s hash, but the ledger goes on to round {last} (rounds not covered by the head)")
        else:
            problems.append(f"head {head[:12]} is the hash of no round in the ledger (the last round(s) removed or edited)")
    if ref is not None and numbers:
        history = [e.root for e in ref.history]
        chain = [hashes.get(n) for n in numbers]
        if history != chain and not problems:
            problems.append(f"the head's history ({len(history)} entries) does not list the rounds' hashes in order (head rewritten)")
    return LedgerReport(tenant, store.uri, not problems, len(numbers), head, tuple(problems))


__all__ = [
    "HEAD_NAME",
    "LEDGER_FORMAT",
    "LedgerReport",
    "append_round",
    "head_ref",
    "list_rounds",
    "read_head",
    "round_hash",
    "round_key",
    "validate_tenant",
    "verify_ledger",
]
