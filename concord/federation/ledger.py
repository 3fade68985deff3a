"""The federation ledger: one hash-chained record per round, per tenant.

Layout, in any store::

    ledger/<tenant>/<round:06d>.json   one round: its number, tenant, time, the hash of the round
                                       before (``prev``, null for the first), the caller's fields
                                       (method, weights, inputs, result, metrics) and ``hash``
    refs/<tenant>/_ledger              the head: the hash of the newest round (its history lists
                                       every round's hash, in order)
    ledger/<tenant>/head.json          in a keyed ledger, the signed head: tenant, round number and
                                       round hash of the newest round, signed by the key of the
                                       cluster that appended it (or last signed the head)

``hash`` is BLAKE3 of the canonical JSON of every other field, so editing any field of a round,
removing or reordering rounds, or copying a round in from another tenant's ledger breaks either a
round's own hash, the ``prev`` chain, the numbering or the head, and :func:`verify_ledger` names
which. Unkeyed, the ledger makes tampering evident but does not stop someone who can write the
store from rewriting it consistently; keyed (each round signed over its hash by the key of the
cluster that appends it, ``record_round(..., key=)``), ``verify_ledger(..., trust=policy)``
also names any round no trusted key signed. A signed round cannot be forged, but the newest
rounds can be dropped and the head rewound onto the last one kept; so a keyed append also signs
the head (:func:`sign_head`), and under a trust policy the head must be signed by a trusted key and
name the last round. What remains is a rollback to an older signed head *with* its rounds (an
older copy of the whole ledger): only a reader that remembers how far the ledger went can catch
it, and ``verify_ledger(..., min_round=N, min_hash=H)`` is that check (``concord federate verify``
keeps N and H for each ledger it verified: :mod:`concord.federation.seen`).

Quorum. A round's record and the head carry, beside the appender's ``signature``, the
``signatures`` of the other clusters that verified the round's aggregate (:func:`cosign_round`:
each cluster checks the root it received before it signs). Under a policy with a threshold K
(``--trust policy.yaml``, ``--trust-threshold K``) a round, and the head, count only when at
least K *distinct* trusted keys signed them, by :meth:`~concord.trust.TrustPolicy.count_records`,
the rule every consumer of a trust policy applies: a forged signature, one over another round,
or one key signing twice never makes up the number.

Appending is safe under concurrency: the round's document is written only if no document holds
that number yet (two rounds racing for one number: one wins, the other gets
:class:`~concord.errors.LedgerConflictError` and writes nothing), then the head moves by
compare-and-swap. A run stopped between those two writes leaves a complete round just past the
head; the next append adopts it (its hash and ``prev`` checked) before adding its own, so a
writer may find that another one moved the head onto its round: that round is recorded all the
same, and :func:`record_round` says so.

A round's *content* is every field but the ledger's own (:data:`RESERVED`); its
:func:`content_hash` makes appending idempotent: a record whose content is already in the
ledger (an earlier attempt, a retry after a conflict or a network error, or the same round
written by another writer) is never appended again; the round already there is the answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from concord.errors import InvalidNameError, LedgerConflictError, LedgerError, RefConflictError
from concord.hashing import canonical_json
from concord.stores.base import LEDGER_HEAD, Store, validate_segment

if TYPE_CHECKING:
    from concord.trust import SigningKey, TrustPolicy

LEDGER_FORMAT = "concord/ledger-round@1"
#: the ref (in the tenant's namespace) holding the hash of the newest round
HEAD_NAME = LEDGER_HEAD
#: fields every round has, set by :func:`append_round` (a record may not carry them)
RESERVED = ("format", "round", "tenant", "time", "prev", "hash", "signature", "signatures")
#: fields a round's hash does not cover: the hash itself and the signatures over it
UNSIGNED = ("hash", "signature", "signatures")

_ROUND_FILE = re.compile(r"^(\d{6})\.json$")
#: the signed head's format and document name (``ledger/<tenant>/head.json``)
HEAD_FORMAT = "concord/ledger-head@1"
HEAD_DOC = "head.json"
_ADOPT_ATTEMPTS = 50  # each failed attempt means another writer made progress meanwhile

#: what became of a record given to :func:`record_round`
RECORDED = "recorded"  # this call wrote the round and moved the head onto it
ADOPTED = "adopted"  # this call wrote the round; another writer moved the head onto it
ALREADY = "already"  # the same content was already in the ledger: nothing was appended


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


def head_key(tenant: str) -> str:
    """Store document key of ``tenant``'s signed head."""
    return f"{ledger_prefix(tenant)}/{HEAD_DOC}"


def head_statement(tenant: str, number: int, digest: str) -> str:
    """What a signed head says, as the exact text its signature covers."""
    return canonical_json({"format": HEAD_FORMAT, "tenant": tenant, "round": number, "hash": digest}).decode()


def round_hash(doc: dict) -> str:
    """BLAKE3 of the canonical JSON of every field of ``doc`` but ``hash``, ``signature`` and
    ``signatures`` (which sign the hash)."""
    from blake3 import blake3

    return blake3(canonical_json({k: v for k, v in doc.items() if k not in UNSIGNED})).hexdigest()


def content_hash(doc: dict) -> str:
    """BLAKE3 of the canonical JSON of a round's own content: every field of ``doc`` (a round or
    a record) but the ledger's (:data:`RESERVED`). Two rounds with equal content hashes record
    the same thing, whatever their numbers and times."""
    from blake3 import blake3

    return blake3(canonical_json({k: v for k, v in doc.items() if k not in RESERVED})).hexdigest()


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
    from concord.errors import NotRegularFileError

    try:
        data = store.get_document(key)
    except NotRegularFileError as exc:
        raise LedgerError(
            f"{store.uri}/{key}", f"not a regular file ({exc.kind})", "Remove it and copy the round back from a good copy of the store."
        ) from None
    if data is None:
        raise LedgerError(f"{store.uri}/{key}", "the round's document disappeared while it was being read")
    from concord.documents import MAX_ROUND_BYTES, load_json_document, need_int, need_optional_str, need_str

    def fail(problem: str) -> LedgerError:
        return LedgerError(f"{store.uri}/{key}", problem)

    doc = load_json_document(data, f"{store.uri}/{key}", max_bytes=MAX_ROUND_BYTES, error=fail)
    # the ledger's own fields, where present, have their types (what is missing verify_ledger names)
    for name in ("format", "tenant", "time", "hash"):
        if name in doc:
            need_str(doc[name], name, fail, max_len=256)
    if "prev" in doc:
        need_optional_str(doc["prev"], "prev", fail, max_len=256)
    if "round" in doc:
        need_int(doc["round"], "round", fail, low=1, high=999_999)
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


def _tip(store: Store, tenant: str) -> tuple[int, str | None, list[dict]]:
    """(number of the newest round, its hash, every round), after adopting a round whose append
    was stopped between writing its document and moving the head. Raises
    :class:`LedgerError` when the documents and the head disagree in any other way."""
    where = f"ledger of {tenant!r} in {store.uri}"
    for _ in range(_ADOPT_ATTEMPTS):
        head = read_head(store, tenant)
        rounds = list_rounds(store, tenant)
        last = rounds[-1] if rounds else None
        if last is None:
            if head is None:
                return 0, None, []
            raise LedgerError(where, f"the head names round hash {head[:12]} but no round document is there")
        number = last.get("round")
        if not isinstance(number, int) or number != len(rounds):
            raise LedgerError(where, f"the rounds are not numbered 1 to {len(rounds)}")
        if last.get("hash") == head and round_hash(last) == head:
            return number, head, rounds
        before_ok = head is None if number == 1 else (rounds[-2].get("hash") == head == round_hash(rounds[-2]))
        pending = before_ok and last.get("prev") == head and last.get("hash") == round_hash(last) and last.get("tenant") == tenant
        if pending:
            try:
                store.cas_ref(head_ref(tenant), head, last["hash"], f"round {number} (adopted)")
            except RefConflictError:
                continue  # the head moved meanwhile: look again
            return number, last["hash"], rounds
        if read_head(store, tenant) != head:
            continue  # a concurrent append moved the head between our two reads
        raise LedgerError(
            where,
            f"the head ({head[:12] if head else 'none'}) does not match round {number} "
            f"(hash {str(last.get('hash'))[:12]})",
        )
    raise LedgerError(where, "the ledger kept changing while it was read", "Re-run when other rounds of this tenant have finished.")


@dataclass(frozen=True)
class RoundOutcome:
    """What became of a record given to :func:`record_round`: ``status`` is :data:`RECORDED`
    (this call wrote round ``doc["round"]`` and moved the head onto it), :data:`ADOPTED` (this
    call wrote it and another writer, finding it just past the head, moved the head onto it) or
    :data:`ALREADY` (a round with the same content was already in the ledger, written by an
    earlier attempt or another writer; nothing was appended). In every case ``doc`` is the round
    in the ledger that holds the record."""

    status: str
    doc: dict
    store: str

    @property
    def round(self) -> int:
        return self.doc["round"]

    @property
    def hash(self) -> str:
        return self.doc["hash"]

    def describe(self) -> str:
        where = f"round {self.round} of {self.doc['tenant']} (hash {self.hash[:12]}) in {self.store}"
        if self.status == RECORDED:
            return f"recorded as {where}"
        if self.status == ADOPTED:
            return f"recorded as {where}: written by this run, its head moved by another writer"
        return f"already recorded as {where}, same content (an earlier or concurrent run): nothing appended"


def _holding(rounds: list[dict], content: str) -> dict | None:
    """The first round of ``rounds`` whose content hashes to ``content``."""
    return next((r for r in rounds if content_hash(r) == content), None)


def record_round(store: Store, tenant: str, record: dict, *, key: SigningKey | None = None) -> RoundOutcome:
    """Append a round with the caller's fields ``record`` to ``tenant``'s ledger in ``store``,
    unless a round with the same content is already there, and say what became of it
    (:class:`RoundOutcome`). Safe to retry after any failure: a record is never in the ledger
    twice.

    With ``key`` (the appending cluster's signing key) the round carries ``signature``, that
    key's signature over its hash (:mod:`concord.trust.records`), which ``verify_ledger(...,
    trust=policy)`` requires from a trusted key; the ledger's head is then signed too
    (:func:`sign_head`), also when the record was already there.

    Raises :class:`~concord.errors.LedgerConflictError` when a different round took this round's
    number first (nothing of this one is kept: run it again to record it as a later round; the
    error names the round that won), :class:`~concord.errors.LedgerError` for a bad record or a
    ledger that does not verify.
    """
    outcome = _record_round(store, tenant, record, key)
    if key is not None:
        sign_head(store, tenant, key)
    return outcome


def _record_round(store: Store, tenant: str, record: dict, key: SigningKey | None) -> RoundOutcome:
    validate_tenant(tenant)
    fields = _prepare(tenant, record)
    mine = content_hash(fields)
    number, prev, rounds = _tip(store, tenant)
    there = _holding(rounds, mine)
    if there is not None:
        # an earlier attempt (perhaps stopped before the head moved, adopted just now by _tip), a
        # retry after a conflict or the same round from another writer: that round is this one
        return RoundOutcome(ALREADY, there, store.uri)
    doc = {
        "format": LEDGER_FORMAT,
        "round": number + 1,
        "tenant": tenant,
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "prev": prev,
        **fields,
    }
    doc["hash"] = round_hash(doc)
    if key is not None:
        from concord.trust.records import ROUND_TYPE, sign_record

        doc["signature"] = sign_record(key, ROUND_TYPE, doc["hash"])
    where = round_key(tenant, doc["round"])
    if not store.put_document(where, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", overwrite=False):
        # another writer took this number first: with this content (then it is recorded) or another
        winner = _load(store, where)
        if content_hash(winner) == mine:
            _tip(store, tenant)  # anchor it if its writer has not moved the head yet
            return RoundOutcome(ALREADY, winner, store.uri)
        raise LedgerConflictError(store.uri, tenant, doc["round"], prev, read_head(store, tenant), winner=winner.get("hash"))
    for _ in range(_ADOPT_ATTEMPTS):
        try:
            store.cas_ref(head_ref(tenant), prev, doc["hash"], f"round {doc['round']}")
        except RefConflictError as exc:
            # the head moved while this round's document was in place; since no other document
            # can ever hold this number, the writer that moved it found this round and adopted it
            ref = store.read_ref(head_ref(tenant))
            if ref is not None and doc["hash"] in [e.root for e in ref.history]:
                return RoundOutcome(ADOPTED, doc, store.uri)
            if (ref.root if ref is not None else None) == prev:
                continue  # the conditional write lost a race that left the head where it was
            raise LedgerError(
                f"ledger of {tenant!r} in {store.uri}",
                f"round {doc['round']} (hash {doc['hash'][:12]}) was written, but the head moved to "
                f"{str(exc.actual)[:12]}, which does not follow it",
                f"Check it with `concord federate verify {tenant} --store {store.uri}`.",
            ) from exc
        return RoundOutcome(RECORDED, doc, store.uri)
    raise LedgerError(
        f"ledger of {tenant!r} in {store.uri}",
        f"the head kept changing while round {doc['round']} was recorded",
        "Run it again: a round already in the ledger is never recorded twice.",
    )


def sign_head(store: Store, tenant: str, key: SigningKey) -> dict | None:
    """Sign ``tenant``'s head as it is now (its newest round's number and hash, checked against the
    round's document) with ``key`` and keep it at ``ledger/<tenant>/head.json``; the document
    written, or None for an empty ledger. Safe beside concurrent appends: after writing, the head
    is read again, and if it moved meanwhile the new head is signed in turn, so the document the
    last writer leaves names the last round."""
    from concord.trust.records import HEAD_TYPE, sign_record

    validate_tenant(tenant)
    for _ in range(_ADOPT_ATTEMPTS):
        number, digest, _ = _tip(store, tenant)
        if digest is None:
            return None
        doc = {"format": HEAD_FORMAT, "tenant": tenant, "round": number, "hash": digest}
        doc["signature"] = sign_record(key, HEAD_TYPE, head_statement(tenant, number, digest))
        try:
            before = read_signed_head(store, tenant) or {}
        except LedgerError:
            before = {}
        same = (before.get("format"), before.get("tenant"), before.get("round"), before.get("hash")) == (HEAD_FORMAT, tenant, number, digest)
        if same and isinstance(before.get("signatures"), list):
            doc["signatures"] = before["signatures"]  # the co-signers of this same head stay
        old = before.get("signature")
        if same and isinstance(old, dict) and old.get("key_id") != key.id:
            doc = _add_signature(doc, old)  # so does the cluster that signed it before
        store.put_document(head_key(tenant), json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n", overwrite=True)
        if read_head(store, tenant) == digest:
            return doc
    raise LedgerError(
        f"ledger of {tenant!r} in {store.uri}", "the head kept moving while it was signed", "Sign it again when the other rounds have finished."
    )


def read_signed_head(store: Store, tenant: str) -> dict | None:
    """``tenant``'s signed head document as stored (not verified), or None when there is none."""
    key = head_key(tenant)
    if store.get_document(key) is None:
        return None
    return _load(store, key)


def _head_problems(store: Store, tenant: str, trust: TrustPolicy, last: int | None, digest: str | None) -> list[str]:
    """Why the signed head does not vouch for the ledger's last round ``last`` (hash ``digest``)."""
    from concord.trust.records import HEAD_TYPE

    where = f"{head_key(tenant)}"
    try:
        doc = read_signed_head(store, tenant)
    except LedgerError as exc:
        return [f"signed head: unreadable ({exc.problem}); restore {where} from a good copy"]
    if doc is None:
        if last is None:
            return []
        return [f"the head is not signed (no {where}): append rounds with a key (federate run --key), or restore it from a good copy"]
    problems = []
    number, said = doc.get("round"), doc.get("hash")
    if doc.get("format") != HEAD_FORMAT or doc.get("tenant") != tenant or not isinstance(number, int) or not isinstance(said, str):
        return [f"signed head: not a head of tenant {tenant!r} ({where} altered or copied from another ledger)"]
    problem = _quorum_problem(trust, _signatures_of(doc), HEAD_TYPE, head_statement(tenant, number, said))[1]
    if problem:
        problems.append(f"signed head: {problem}")
    if (number, said) != (last, digest):
        if number == last:
            now = f"round {last} now hashes to {str(digest)[:12]} (rounds rewritten after it was signed)"
        elif last is None or number > last:
            now = f"the ledger ends at {f'round {last}' if last else 'no round'} (rounds removed after it was signed)"
        else:
            now = f"the ledger goes on to round {last} (rounds appended without a trusted key after it was signed)"
        problems.append(f"signed head names round {number} (hash {said[:12]}), but {now}")
    return problems


def _signatures_of(doc: dict) -> list[object]:
    """Every signature a round or head document carries: the appender's, then the co-signers'."""
    extra = doc.get("signatures")
    extra = extra if isinstance(extra, list) else [] if extra is None else [extra]  # a malformed list is a malformed signature
    return [s for s in (doc.get("signature"), *extra) if s is not None]


def _quorum_problem(trust: TrustPolicy, signatures: list[object], payload_type: str, digest: str) -> tuple[tuple[str, ...], str | None]:
    """The distinct trusted keys whose signature over ``digest`` verifies, and why that is not
    enough (None when at least the policy's threshold signed)."""
    signers, problems = trust.count_records(signatures, payload_type, digest)
    if len(signers) >= trust.threshold:
        return signers, None
    if not signatures:
        return signers, "not signed (no trusted key vouches for it)"
    if trust.threshold == 1:
        return signers, f"{next(iter(problems.values()))} (no trusted key vouches for it)"
    why = "; ".join(f"{kid[:16]}: {p}" for kid, p in list(problems.items())[:3])
    return signers, f"signed by {trust.quorum(signers)}" + (f" ({why})" if why else "")


def _add_signature(doc: dict, signature: dict) -> dict:
    """``doc`` with ``signature`` among its co-signatures (replacing an older one by its key)."""
    others = [s for s in doc.get("signatures") or [] if not (isinstance(s, dict) and s.get("key_id") == signature["key_id"])]
    return {**doc, "signatures": [*others, signature]}


def cosign_round(store: Store, tenant: str, number: int, key: SigningKey) -> dict:
    """Add ``key``'s signature over round ``number``'s hash to the round's document in ``store``
    (and to the signed head, when the head names that round): what a cluster does once it has
    checked the round's aggregate (:func:`concord.federation.rounds.cosign`). The round's hash
    is recomputed first: an edited round is never co-signed. Safe to repeat and beside other
    co-signers: each write is read back, and written again if another one replaced it."""
    from concord.trust.records import HEAD_TYPE, ROUND_TYPE, sign_record

    validate_tenant(tenant)
    where = round_key(tenant, number)
    for _ in range(_ADOPT_ATTEMPTS):
        if store.get_document(where) is None:
            raise LedgerError(f"ledger of {tenant!r} in {store.uri}", f"there is no round {number}", "Co-sign a round the ledger holds.")
        doc = _load(store, where)
        actual = round_hash(doc)
        if doc.get("hash") != actual or doc.get("round") != number or doc.get("tenant") != tenant:
            raise LedgerError(
                f"round {number} of {tenant!r} in {store.uri}", "it does not hash to what it records (edited)",
                f"Check it with `concord federate verify {tenant} --store {store.uri}`; nothing was signed.",
            )
        signature = sign_record(key, ROUND_TYPE, actual)
        if signature not in (doc.get("signatures") or []) and doc.get("signature") != signature:
            store.put_document(where, json.dumps(_add_signature(doc, signature), indent=1, sort_keys=True).encode() + b"\n", overwrite=True)
        if any(isinstance(s, dict) and s.get("key_id") == key.id for s in _signatures_of(_load(store, where))):
            break
    else:
        raise LedgerError(f"round {number} of {tenant!r} in {store.uri}", "other co-signers kept replacing it", "Co-sign it again.")
    for _ in range(_ADOPT_ATTEMPTS):
        head = read_signed_head(store, tenant)
        if head is None or head.get("round") != number or head.get("hash") != actual:
            break  # the head has moved on: it is signed for its own round
        statement = head_statement(tenant, number, actual)
        signed = _add_signature(head, sign_record(key, HEAD_TYPE, statement))
        store.put_document(head_key(tenant), json.dumps(signed, indent=1, sort_keys=True).encode() + b"\n", overwrite=True)
        again = read_signed_head(store, tenant) or {}
        if any(isinstance(s, dict) and s.get("key_id") == key.id for s in _signatures_of(again)) or again.get("round") != number:
            break
    return _load(store, where)


def append_round(store: Store, tenant: str, record: dict) -> dict:
    """:func:`record_round`, returning only the round's document (``round``, ``tenant``,
    ``time``, ``prev``, the record's fields, ``hash``): the one this call appended, or the round
    already holding the same content."""
    return record_round(store, tenant, record).doc


@dataclass(frozen=True)
class LedgerReport:
    """What :func:`verify_ledger` found: ``ok`` only when ``problems`` is empty."""

    tenant: str
    store: str
    ok: bool
    rounds: int
    head: str | None
    problems: tuple[str, ...] = field(default_factory=tuple)
    #: the number of the newest round document found (None: no round)
    last_round: int | None = None
    #: the problem, among ``problems``, saying the ledger is behind or unlike what was seen before
    #: (``min_round``/``min_hash``): rolled back or rewritten; None when it is not
    rollback: str | None = None
    #: under a trust policy, each round's number → the names of the distinct trusted keys whose
    #: signatures over it verify (empty without a policy)
    signed_by: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "tenant": self.tenant,
            "store": self.store,
            "ok": self.ok,
            "rounds": self.rounds,
            "last_round": self.last_round,
            "head": self.head,
            "problems": list(self.problems),
            "rollback": self.rollback,
            "signed_by": {str(n): list(names) for n, names in self.signed_by.items()},
        }


def verify_ledger(
    store: Store, tenant: str, *, trust: TrustPolicy | None = None, min_round: int | None = None, min_hash: str | None = None
) -> LedgerReport:
    """Check ``tenant``'s ledger in ``store``: every round's own hash, its tenant and number, the
    ``prev`` chain from the first round to the last, and the head (and its history) against the
    rounds. With ``trust``, every round must also carry a signature over its hash by one of the
    policy's keys: a round forged (or re-chained) by someone who can write the store but holds no
    trusted key is named; and the head must be signed by one of them and name the last round, so
    rounds dropped from the end are named too. ``min_round`` is the round the reader saw last
    time: a ledger that now ends before it was rolled back (the one thing signatures cannot show);
    ``min_hash``, the hash round ``min_round`` had then: a ledger whose round ``min_round`` now
    hashes otherwise had its history rewritten. Either is also the report's ``rollback``.
    Every problem found is listed; nothing is changed."""
    validate_tenant(tenant)
    problems: list[str] = []
    signed_by: dict[int, tuple[str, ...]] = {}
    prefix = ledger_prefix(tenant)
    docs: dict[int, dict] = {}
    for key in store.list_documents(prefix):
        n = _round_number(key, tenant)
        if n is None:
            if key == head_key(tenant):
                continue  # the signed head, checked below
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
        if trust is not None:
            from concord.trust.records import ROUND_TYPE

            signers, problem = _quorum_problem(trust, _signatures_of(doc), ROUND_TYPE, actual)
            signed_by[n] = tuple(trust.name_of(k) for k in signers)
            if problem:
                problems.append(f"round {n}: {problem}")

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
    if trust is not None:
        problems += _head_problems(store, tenant, trust, last, hashes.get(last) if last is not None else None)
    rollback = None
    if min_round is not None and (last or 0) < min_round:
        rollback = (
            f"the ledger ends at round {last or 0}, but it went to round {min_round} before (rolled back: "
            "rounds removed together with the head that signed them)"
        )
    elif min_round is not None and min_hash is not None and hashes.get(min_round) != min_hash:
        now = hashes.get(min_round)
        rollback = (
            f"round {min_round} now hashes to {now[:12] if now else '(unreadable)'}, but it was {min_hash[:12]} "
            "when seen before (history rewritten: an older or other copy of the ledger put in its place)"
        )
    if rollback is not None:
        problems.append(rollback)
    return LedgerReport(tenant, store.uri, not problems, len(numbers), head, tuple(problems), last, rollback, signed_by)


__all__ = [
    "ADOPTED",
    "ALREADY",
    "HEAD_NAME",
    "LEDGER_FORMAT",
    "LedgerReport",
    "RECORDED",
    "RoundOutcome",
    "append_round",
    "content_hash",
    "cosign_round",
    "head_key",
    "head_ref",
    "head_statement",
    "list_rounds",
    "read_head",
    "read_signed_head",
    "record_round",
    "round_hash",
    "round_key",
    "sign_head",
    "validate_tenant",
    "verify_ledger",
]
