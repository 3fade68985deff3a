"""Hostile store contents are answered in one clear line, and never hang.

Whatever sits where a folder store expects a ref, manifest, chunk, ledger round or tier record —
a FIFO, a folder, a link to /dev/zero, JSON nested a hundred thousand deep, ``1e400``,
``10**400``, a field of the wrong type, a truncated or oversized document — every reading
command ends in one line naming the thing (exit status 1, one line on stderr, no traceback), and
every core reader raises a :class:`~concord.errors.ConcordError` that is also the standard
exception a caller expects. The property-based test at the end fuzzes documents at every
location; ``test_zz_tally`` prints how many distinct hostile inputs were tried and how many ended
in one clear line.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toy_checkpoints import make_checkpoint

from concord import documents
from concord.cli import main
from concord.errors import (
    ConcordError,
    DocumentError,
    LedgerError,
    ManifestError,
    NotRegularFileError,
    RefFormatError,
    StoreNotFoundError,
)
from concord.federation.ledger import append_round, list_rounds, verify_ledger
from concord.hashing import chunk_id
from concord.snapshots.manifest import Manifest, make_file, make_part
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore, open_store_to_read
from concord.stores.base import Ref, manifest_key
from concord.tiering.catalog import CopyRecord, read_records, record_key, write_record

pytestmark = pytest.mark.timeout(120)

NS = "llama-lora"
TENANT = "acme"
REF = "models/toy"
ROUND_KEY = f"ledger/{TENANT}/000001.json"
RECORD_KEY = record_key(NS, "step-1")

#: every hostile input tried, and those that ended in one clear line (printed by test_zz_tally)
TRIED: set[str] = set()
CLEAR: set[str] = set()


# --------------------------------------------------------------------------- a store to damage


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A store with a snapshot (ref models/toy), a federation round of tenant acme and a tier
    record, plus a tier policy whose hot tier is that store. Each test damages a copy."""
    base = tmp_path_factory.mktemp("template")
    store = LocalDirStore(base / "s")
    r = snapshot(make_checkpoint(base / "ckpt"), store, ref=REF)
    append_round(store, TENANT, {"method": "exact", "inputs": [{"adapter": "acme/a"}], "result": {"root": r.root}})
    write_record(
        store,
        NS,
        CopyRecord("step-1", r.root, "hot", "2024-01-01T00:00:00+00:00", 1, 10, 1, "2024-01-01T00:00:00+00:00", None, None),
    )
    (base / "root").write_text(r.root)
    return base


class Site:
    """A fresh copy of the template: the store, its root, and the paths of what can be damaged."""

    def __init__(self, base: Path, dest: Path) -> None:
        shutil.copytree(base / "s", dest / "s", symlinks=True)
        self.dir = dest
        self.store = dest / "s"
        self.root = (base / "root").read_text()
        manifest = load_manifest(LocalDirStore(self.store), self.root)
        self.chunk = manifest.files[0].parts[0].chunk_ids()[0]
        self.policy = dest / "policy.yaml"
        self.policy.write_text(
            yaml.safe_dump(
                {
                    "namespace": NS,
                    "hot": {"store": str(self.store), "keep": 2},
                    "warm": {"store": str(dest / "warm"), "keep": 3, "media": "nas"},
                    "cold": {"store": str(dest / "cold"), "media": "tape", "offsite": True},
                }
            )
        )

    def key(self, location: str) -> str:
        return {
            "ref": f"refs/{REF}",
            "manifest": manifest_key(self.root),
            "chunk": f"chunks/{self.chunk[:2]}/{self.chunk}",
            "round": ROUND_KEY,
            "record": RECORD_KEY,
        }[location]

    def path(self, location: str) -> Path:
        return self.store / self.key(location)

    def replace(self, location: str, make) -> None:
        """Remove what is at ``location`` and let ``make(path)`` put something else there."""
        p = self.path(location)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        make(p)

    def commands(self, location: str) -> list[list[str]]:
        """The reading commands that read ``location``, with the text that names the thing."""
        s, out = str(self.store), str(self.dir / f"out{len(os.listdir(self.dir))}")
        return {
            "ref": [["refs", s], ["log", s, REF], ["restore", s, "--ref", REF, out], ["verify", s],
                    ["verify", s, "--ref", REF], ["diff", s, REF, REF]],
            "manifest": [["restore", s, "--root", self.root, out], ["verify", s], ["verify", s, "--ref", REF],
                         ["diff", s, REF, self.root]],
            "chunk": [["verify", s], ["verify", s, "--ref", REF], ["restore", s, "--ref", REF, out]],
            "round": [["federate", "verify", TENANT, "--store", s], ["federate", "log", TENANT, "--store", s]],
            "record": [["tier", "status", "--policy", str(self.policy)]],
        }[location]

    def needles(self, location: str) -> tuple[str, ...]:
        """Any of these in the output names the damaged thing."""
        key = self.key(location)
        return {
            "ref": (key, f"ref {REF}"),
            "manifest": (key, self.root, self.root[:12]),
            "chunk": (key, self.chunk),
            "round": (key, "round 1", f"ledger of {TENANT}"),
            "record": (key,),
        }[location]


def one_clear_line(capsys, argv: list[str], needles: tuple[str, ...], may_succeed: bool = False) -> tuple[bool, str]:
    """Run the CLI in-process; True when it ended in one clear line: a non-zero exit status,
    exactly one line on stderr (``concord: ...``, no traceback), naming the damaged thing. With
    ``may_succeed`` a clean success (exit 0, nothing on stderr) counts too."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: not what we test here
        code = exc.code
    except BaseException as exc:  # noqa: BLE001 - an escaped exception is exactly the failure
        capsys.readouterr()
        return False, f"{argv}: raised {type(exc).__name__}: {exc}"
    out, err = capsys.readouterr()
    lines = err.splitlines()
    if may_succeed and code == 0 and not err:
        return True, ""
    ok = (
        code not in (0, None)
        and len(lines) == 1
        and lines[0].startswith("concord: ")
        and "Traceback" not in err
        and any(n in err or n in out for n in needles)
    )
    return ok, f"{argv}: exit {code}, stderr {err!r}"


def check_all(capsys, site: Site, location: str, label: str, may_succeed=lambda argv: False) -> list[str]:
    """Every reading command of ``location``; the problems (empty when each ended in one clear
    line). An input no command may succeed on is a hostile input, and is counted."""
    hostile = not any(may_succeed(argv) for argv in site.commands(location))
    if hostile:
        TRIED.add(f"{location}:{label}")
    problems = []
    for argv in site.commands(location):
        ok, what = one_clear_line(capsys, argv, site.needles(location), may_succeed(argv))
        if not ok:
            problems.append(what)
    if hostile and not problems:
        CLEAR.add(f"{location}:{label}")
    return problems


# --------------------------------------------------------------------------- non-regular files


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _folder(p: Path) -> None:
    (p / "inside").mkdir(parents=True)


def _dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _loop(p: Path) -> None:
    p.symlink_to(p.name)  # a link to itself


NON_REGULAR = {"fifo": _fifo, "folder": _folder, "link-to-dev-zero": _dev_zero, "link-loop": _loop}
LOCATIONS = ("ref", "manifest", "chunk", "round", "record")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("location", LOCATIONS)
@pytest.mark.parametrize("kind", sorted(NON_REGULAR))
def test_non_regular_files_are_refused_in_one_line_never_read(template, tmp_path, capsys, location, kind):
    site = Site(template, tmp_path)
    site.replace(location, NON_REGULAR[kind])
    assert check_all(capsys, site, location, kind) == []


@pytest.mark.timeout(30)
def test_every_reading_primitive_refuses_a_fifo_without_blocking(template, tmp_path):
    site = Site(template, tmp_path)
    for location in LOCATIONS:
        site.replace(location, _fifo)
    store = LocalDirStore(site.store)
    calls = {
        "read_ref": lambda: store.read_ref(REF),
        "get_manifest_bytes": lambda: store.get_manifest_bytes(site.root),
        "get_chunk": lambda: store.get_chunk(site.chunk),
        "read_chunk_raw": lambda: store.read_chunk_raw(site.chunk),
        "get_document(round)": lambda: store.get_document(ROUND_KEY),
        "get_document(record)": lambda: store.get_document(RECORD_KEY),
        "cas_ref": lambda: store.cas_ref(REF, site.root, "0" * 64),
        "delete_ref": lambda: store.delete_ref(REF, site.root),
    }
    for name, call in calls.items():
        with pytest.raises(NotRegularFileError) as info:
            call()
        assert isinstance(info.value, OSError), name
        message = str(info.value)
        assert "\n" not in message and "not a regular file (a fifo)" in message and str(site.store) in message, name
    assert "refs/models/toy in" in str(pytest.raises(NotRegularFileError, store.read_ref, REF).value)
    assert "copy the ref back from another store" in str(pytest.raises(NotRegularFileError, store.read_ref, REF).value)
    # a FIFO is not listed as a chunk that is there, and the ledger and records readers say which
    assert store.has_chunks([site.chunk]) == set()
    with pytest.raises(LedgerError, match="not a regular file"):
        list_rounds(store, TENANT)
    report = verify_ledger(store, TENANT)
    assert not report.ok and any("round 1" in p and "fifo" in p for p in report.problems)
    with pytest.raises(NotRegularFileError, match=RECORD_KEY):
        read_records(store, NS)


def test_verify_repairs_a_fifo_where_a_chunk_should_be(template, tmp_path, capsys):
    site = Site(template, tmp_path)
    good = tmp_path / "good"
    shutil.copytree(site.store, good)
    site.replace("chunk", _fifo)
    code = main(["verify", str(site.store), "--json"])
    out, err = capsys.readouterr()
    assert code == 15 and json.loads(out)["corrupt"] == [site.chunk] and err.count("\n") == 1
    assert main(["verify", str(site.store), "--repair-from", str(good), "--json"]) == 0
    capsys.readouterr()
    assert site.path("chunk").is_file()


# --------------------------------------------------------------------------- hostile documents


def _nest(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


def _ref_doc(root: str, **entry) -> dict:
    e = {"root": root, "version": 1, "time": "2024-01-01T00:00:00+00:00", "message": ""}
    e.update(entry)
    return {"format": "concord/ref@1", "name": REF, "root": root, "version": 1, "history": [e]}


def hostile_texts(location: str, site: Site) -> dict[str, bytes]:
    """Named hostile documents for ``location`` (whole-document damage, then wrong field types)."""
    valid = site.path(location).read_bytes()
    out = {
        "deep-array": b"[" * 100_000 + b"]" * 100_000,
        "deep-object": _nest(50_000).encode(),
        "deep-but-parsable": _nest(200).encode(),
        "1e400": b'{"version": 1e400}',
        "10**400": b'{"version": 1' + b"0" * 400 + b"}",
        "10**5000": b'{"version": 1' + b"0" * 5000 + b"}",
        "NaN": b'{"version": NaN}',
        "-Infinity": b'{"version": -Infinity}',
        "not-utf8": b"\xff\xfe\x00{",
        "truncated": valid[: len(valid) // 2],
        "empty": b"",
        "top-level-list": b"[]",
        "top-level-string": b'"x"',
        "null": b"null",
    }
    doc = json.loads(valid)
    mutations: dict[str, object] = {}
    if location == "ref":
        for name, value in {
            "version-string": "1", "version-float": 1.5, "version-bool": True, "version-negative": -1,
            "version-null": None, "version-list": [], "time-int": 5, "message-object": {},
        }.items():
            field = name.split("-")[0]
            mutations[name] = _ref_doc(site.root, **{field: value})
        mutations["root-int"] = _ref_doc(5)
        mutations["history-object"] = {**doc, "history": {}}
        mutations["history-empty"] = {**doc, "history": []}
        mutations["history-of-ints"] = {**doc, "history": [5]}
    elif location == "manifest":
        part = doc["files"][0]["parts"][0]
        for name, (where, field, value) in {
            "chunk_size-string": (doc, "chunk_size", "4M"),
            "files-object": (doc, "files", {}),
            "size-string": (doc["files"][0], "size", "1"),
            "parts-int": (doc["files"][0], "parts", 3),
            "length-huge": (part, "length", 2**62),
            "offset-negative": (part, "offset", -1),
            "chunks-list": (part, "chunks", []),
            "name-int": (part, "name", 7),
        }.items():
            copy = json.loads(valid)
            target = copy if where is doc else (copy["files"][0] if where is doc["files"][0] else copy["files"][0]["parts"][0])
            target[field] = value
            mutations[name] = copy
        mutations["root-int"] = {**doc, "root": 5}
    elif location == "round":
        for field, value in {"round": "1", "tenant": 5, "hash": [], "prev": 5, "time": {}, "inputs": 5, "result": "x"}.items():
            mutations[f"{field}-{type(value).__name__}"] = {**doc, field: value}
    elif location == "record":
        for field, value in {"bytes": "10", "step": 1.5, "name": 5, "root": 5, "files": None, "created": [], "tier": {}}.items():
            mutations[f"{field}-{type(value).__name__}"] = {**doc, field: value}
    for name, value in mutations.items():
        out[name] = json.dumps(value).encode()
    return out


DOC_LOCATIONS = ("ref", "manifest", "round", "record")


@pytest.mark.parametrize("location", DOC_LOCATIONS)
def test_hostile_documents_end_in_one_clear_line(template, tmp_path, capsys, location):
    site = Site(template, tmp_path)
    failures = {}
    valid = site.path(location).read_bytes()
    for label, data in hostile_texts(location, site).items():
        may_succeed = _may_succeed(location, data, valid, site)
        site.replace(location, lambda p, data=data: p.write_bytes(data))
        problems = check_all(capsys, site, location, label, may_succeed)
        if problems:
            failures[label] = problems
    assert failures == {}


def test_oversized_documents_are_refused_before_parsing(template, tmp_path, capsys, monkeypatch):
    site = Site(template, tmp_path)
    for name in ("MAX_REF_BYTES", "MAX_MANIFEST_BYTES", "MAX_ROUND_BYTES", "MAX_RECORD_BYTES"):
        monkeypatch.setattr(documents, name, 4096)
    failures = {}
    for location in DOC_LOCATIONS:
        valid = json.loads(site.path(location).read_bytes())
        valid["padding"] = "x" * 5000  # valid JSON, only too large
        site.replace(location, lambda p, valid=valid: p.write_bytes(json.dumps(valid).encode()))
        problems = check_all(capsys, site, location, "oversized")
        if problems:
            failures[location] = problems
        shutil.rmtree(site.store)
        shutil.copytree(template / "s", site.store, symlinks=True)
    assert failures == {}


def test_core_readers_raise_one_line_errors_of_the_expected_types():
    cases = [
        (lambda d: Ref.from_json(REF, d, "/s"), RefFormatError, ValueError),
        (lambda d: Manifest.from_json(d, expected_root="ab" * 32), ManifestError, ValueError),
        (lambda d: CopyRecord.from_json(d, "tiers/x/y.json in /s"), DocumentError, ValueError),
    ]
    docs = [b"[" * 100_000, b'{"version": 1e400}', b'{"version": 1' + b"0" * 400 + b"}", b"\xff", b"{", b'{"a": NaN}']
    for parse, error, stdlib in cases:
        for data in docs:
            with pytest.raises(error) as info:
                parse(data)
            assert isinstance(info.value, (ConcordError, stdlib)) and "\n" not in str(info.value)
    # a record of the right format with a field of the wrong type names the field
    good = json.loads(CopyRecord("n", "ab" * 32, "hot", "t", 1, 2, 3, "t", None, None).to_json())
    with pytest.raises(DocumentError, match=r"tiers/x/y.json in /s: bytes is a string, expected an integer"):
        CopyRecord.from_json(json.dumps({**good, "bytes": "2"}).encode(), "tiers/x/y.json in /s")
    with pytest.raises(RefFormatError, match=r"ref models/toy in /s is unreadable: history entry 0: version is a number"):
        Ref.from_json(REF, json.dumps(_ref_doc("ab" * 32, version=1.5)).encode(), "/s")
    assert documents.load_json_document(b'{"a": [1, 2.5, "x", null, true]}', "d", max_bytes=100) == {"a": [1, 2.5, "x", None, True]}


# --------------------------------------------------------------------------- reading never creates a store


READING = [
    ["verify", "{p}"],
    ["verify", "{p}", "--ref", REF],
    ["refs", "{p}"],
    ["log", "{p}", REF],
    ["diff", "{p}", REF, REF],
    ["restore", "{p}", "--ref", REF, "{out}"],
    ["federate", "verify", TENANT, "--store", "{p}"],
    ["federate", "log", TENANT, "--store", "{p}"],
    ["audit", "replicas", "--ref", REF, "{p}", "{p}2"],
    ["audit", "cards", "--ref", REF, "{p}", "{p}2"],
]


@pytest.mark.parametrize("argv", READING, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("typo", ["missing", "empty-folder", "file"])
def test_reading_commands_never_create_a_store_and_say_there_is_none(tmp_path, capsys, argv, typo):
    p = tmp_path / "typo"
    if typo == "empty-folder":
        p.mkdir()
    elif typo == "file":
        p.write_text("x")
    before = sorted(os.listdir(tmp_path))
    code = main([a.replace("{p}", str(p)).replace("{out}", str(tmp_path / "out")) for a in argv])
    out, err = capsys.readouterr()
    assert code == 10 and out == "" and err.count("\n") == 1  # 10: not found
    assert f"no Concord store at {p}" in err and "check the path" in err
    assert sorted(os.listdir(tmp_path)) == before  # nothing was created
    with pytest.raises(StoreNotFoundError) as info:
        open_store_to_read(str(p))
    assert isinstance(info.value, FileNotFoundError)


def test_tier_status_creates_no_tier_folder(template, tmp_path, capsys):
    site = Site(template, tmp_path)
    assert main(["tier", "status", "--policy", str(site.policy)]) == 0
    capsys.readouterr()
    assert not (tmp_path / "warm").exists() and not (tmp_path / "cold").exists()


# --------------------------------------------------------------------------- verify checks every ref


def test_verify_of_a_whole_store_fails_when_a_ref_names_a_missing_manifest(template, tmp_path, capsys):
    site = Site(template, tmp_path)
    good = tmp_path / "good"
    shutil.copytree(site.store, good)
    site.path("manifest").unlink()
    code = main(["verify", str(site.store)])
    out, err = capsys.readouterr()
    assert code == 15 and err.count("\n") == 1
    assert f"ref {REF} names snapshot {site.root}, whose manifest is missing" in err
    assert "concord sync" in err and "--repair-from" in err
    # repaired from a store that holds it: the ref names a sound snapshot again
    assert main(["verify", str(site.store), "--repair-from", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["repaired"] == [site.root]
    assert site.path("manifest").is_file()


def test_verify_skips_exactly_the_ledger_heads_and_notes_history_gaps(template, tmp_path, capsys):
    site = Site(template, tmp_path)
    store = LocalDirStore(site.store)
    assert main(["verify", str(site.store)]) == 0  # acme/_ledger names a round hash, not a manifest
    capsys.readouterr()
    # a ref whose name merely starts with "_" is a snapshot ref like any other
    fake = "cd" * 32
    store.cas_ref("team/_hidden", None, fake)
    code = main(["verify", str(site.store)])
    _, err = capsys.readouterr()
    assert code == 15 and "ref team/_hidden names snapshot" in err
    store.delete_ref("team/_hidden", fake)
    # an earlier root of a ref's history without its manifest is noted, not a failure
    store.cas_ref(REF, site.root, fake)
    store.cas_ref(REF, fake, site.root)
    code = main(["verify", str(site.store), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["broken_refs"] == [] and len(r["history_gaps"]) == 1 and REF in r["history_gaps"][0]


# --------------------------------------------------------------------------- replicas: claims checked before allocating


def test_audit_replicas_does_not_allocate_what_a_crafted_manifest_claims(template, tmp_path, capsys):
    site = Site(template, tmp_path)
    store = LocalDirStore(site.store)
    chunk_size = 64 * 1024 * 1024
    tib = 1 << 40
    one = b"\0" * 16
    cid = chunk_id(one)
    store.put_chunk(cid, one)
    n = tib // chunk_size
    part = make_part("tensor", "huge", 0, tib, [cid] * n, dtype="U8", shape=[tib])
    manifest = Manifest.build(chunk_size, [make_file("model.safetensors", tib, "safetensors", [part])])
    store.put_manifest(manifest.root, manifest.to_json())
    store.cas_ref("models/huge", None, manifest.root)
    # the reference claims the same shape with other bytes: the tensors differ by hash, so both are read
    other = LocalDirStore(tmp_path / "other")
    two = b"\1" * 16
    other.put_chunk(chunk_id(two), two)
    theirs = make_part("tensor", "huge", 0, tib, [chunk_id(two)] * n, dtype="U8", shape=[tib])
    ref_manifest = Manifest.build(chunk_size, [make_file("model.safetensors", tib, "safetensors", [theirs])])
    other.put_manifest(ref_manifest.root, ref_manifest.to_json())
    other.cas_ref("models/huge", None, ref_manifest.root)
    code = main(["audit", "replicas", "--ref", "models/huge", str(tmp_path / "other"), str(site.store), "--json"])
    out, err = capsys.readouterr()
    assert code != 0 and err.count("\n") == 1 and "Traceback" not in err
    assert f"claims {tib} bytes, more than this machine's" in out
    # the same when the claim fits in memory but the chunks do not hold it: checked before allocating
    from concord.audit.replicas import _Reader

    class Pool:
        def map(self, fn, items):
            return map(fn, items)

    big = make_part("tensor", "big", 0, 1 << 30, [cid] * 16, dtype="U8", shape=[1 << 30])
    with pytest.raises(ManifestError, match=f"chunk {cid} holds 16 bytes, expected {chunk_size}"):
        _Reader(Pool(), None).part_bytes(store, big, chunk_size)


# --------------------------------------------------------------------------- the fuzzer


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
_json_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12
)


_FIELDS = {
    "ref": ("format", "name", "root", "version", "history"),
    "manifest": ("format", "root", "chunk_size", "files"),
    "round": ("format", "round", "tenant", "time", "prev", "hash", "method", "inputs", "result"),
    "record": ("format", "name", "root", "tier", "created", "step", "bytes", "files", "added", "verified",
               "verified_how", "storage_class"),
}


@st.composite
def hostile_document(draw):
    """A location and what to put there: a field of the valid document replaced by any JSON value
    (huge ints, inf, NaN included), deep nesting, a truncated document, raw bytes, or any JSON value."""
    location = draw(st.sampled_from(DOC_LOCATIONS))
    how = draw(st.sampled_from(["field", "nest", "truncate", "bytes", "value"]))
    field = draw(st.sampled_from(_FIELDS[location]) | st.text(min_size=1, max_size=6))
    return location, how, draw(_json_values), draw(st.integers(65, 60_000)), draw(st.binary(max_size=64)), field


def _core_accepts(location: str, data: bytes, site: Site) -> bool:
    """Whether the core's own reader of ``location`` takes ``data`` (then a command may succeed;
    when it does not, every command must end in one clear line)."""
    try:
        if location == "ref":
            Ref.from_json(REF, data, "/s")
        elif location == "manifest":
            Manifest.from_json(data, expected_root=site.root)
        elif location == "record":
            CopyRecord.from_json(data)
        else:
            store = LocalDirStore(site.dir / "oracle")
            store.put_document(ROUND_KEY, data, overwrite=True)
            list_rounds(store, TENANT)
    except ConcordError:
        return False
    return True


def _may_succeed(location: str, data: bytes, valid: bytes, site: Site):
    """Which commands may succeed on ``data``: none when the core refuses it; all when it takes
    it, except that a round whose content changed must fail ``federate verify``."""
    accepted = _core_accepts(location, data, site)
    same_round = location == "round" and accepted and json.loads(data) == json.loads(valid)

    def may_succeed(argv: list[str]) -> bool:
        if not accepted:
            return False
        return not (location == "round" and argv[:2] == ["federate", "verify"] and not same_round)

    return may_succeed


@pytest.mark.timeout(900)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=hostile_document())
def test_fuzzed_store_documents_end_in_one_clear_line(template, tmp_path_factory, capsys, case):
    location, how, value, depth, raw, field = case
    site = Site(template, tmp_path_factory.mktemp("fuzz"))
    valid = site.path(location).read_bytes()
    if how == "field":
        doc = json.loads(valid)
        doc[field] = value
        data = json.dumps(doc, allow_nan=True).encode()  # NaN, Infinity written as a careless writer would
    elif how == "nest":
        data = _nest(depth).encode()
    elif how == "truncate":
        data = valid[: depth % max(1, len(valid))]
    elif how == "bytes":
        data = raw
    else:
        data = json.dumps(value, allow_nan=True).encode()
    may_succeed = _may_succeed(location, data, valid, site)
    site.replace(location, lambda p: p.write_bytes(data))
    label = f"fuzz:{how}:{len(data)}:{data[:120]!r}"
    assert check_all(capsys, site, location, label, may_succeed) == []


@pytest.fixture(scope="module", autouse=True)
def _tally(pytestconfig):
    """After the module: how many distinct hostile inputs were tried, and how many ended in one clear line."""
    yield
    if TRIED:
        pytestconfig.get_terminal_writer().line(f"\n{len(TRIED)} hostile inputs tried, {len(CLEAR)} ended in one clear line")
    assert CLEAR == TRIED, sorted(TRIED - CLEAR)[:5] if isinstance(TRIED, set) else "some hostile inputs did not end in one clear line"
