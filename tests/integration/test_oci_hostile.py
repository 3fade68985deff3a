"""``concord import oci`` and ``export oci`` against registries that lie.

A genuine, signed artifact is exported to a real CNCF distribution registry (``docker-registry``)
and mirrored into a registry of the test's own on 127.0.0.1 (threads, ``http.server``), which
serves the distribution API's paths from memory and can be told to lie on any of them: wrong
JSON shapes, deeply nested JSON, a very deep file path, blob bodies that drip or stall, a gzip
bomb, signatures that do not verify or belong to another root. Every lie is refused in one line;
a refused import leaves the store exactly as it was (or never creates it) and no staging folder
behind; a valid signature is never replaced."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
from servers import patched_environ, running_registry
from toy_checkpoints import SMALL_CHUNK, make_checkpoint

from concord.cli import main
from concord.oci import modelpack as mp
from concord.oci import registry as oci_registry
from concord.oci.memo import MEMO_DIR, DigestMemo, content_key
from concord.oci.reference import parse_reference
from concord.oci.registry import INDEX_TYPE, MANIFEST_TYPE, Registry
from concord.oci.signatures import SIGNATURE_TYPE
from concord.snapshots.refs import load_manifest
from concord.snapshots.snapshot import snapshot
from concord.stores.local import LocalDirStore
from concord.trust import generate_key, sign_root

pytestmark = pytest.mark.integration

CLEARED = ("CONCORD_REGISTRY_USERNAME", "CONCORD_REGISTRY_PASSWORD", "DOCKER_CONFIG")
REPO = "models/toy"
#: the longest any lying handler holds a connection (every wait in these tests is bounded)
HOLD = 20.0


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- the lying registry


class LyingRegistry:
    """The distribution API over dicts: ``manifests`` (tag or digest → (bytes, media type)),
    ``blobs`` (digest → bytes), and ``lies`` (path after ``/v2/REPO/`` → a function that answers
    the request itself)."""

    def __init__(self, manifests: dict, blobs: dict) -> None:
        self.manifests = dict(manifests)
        self.blobs = dict(blobs)
        self.lies: dict = {}
        self.release = threading.Event()  # ends every held connection at teardown
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_release = owner.release

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self.answer(head=True)

            def do_GET(self) -> None:
                self.answer(head=False)

            def do_POST(self) -> None:  # an upload session, whatever is asked
                self.send(202, b"", "text/plain", Location=f"/v2/{REPO}/blobs/uploads/{len(owner.blobs)}")

            def do_PUT(self) -> None:
                """Takes what it is told: a blob under the digest the client names, never checked
                (kept only when its whole body arrived), a manifest under its tag."""
                path, _, query = self.path.partition("?")
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    body = self.rfile.read(length)
                except OSError:
                    body = b""
                if len(body) != length:
                    self.close_connection = True
                    return
                rest = path[len(f"/v2/{REPO}/"):]
                if rest.startswith("blobs/uploads/"):
                    owner.blobs[query.split("digest=", 1)[1].replace("%3A", ":")] = body
                elif rest.startswith("manifests/"):
                    owner.manifests[rest.split("/", 1)[1]] = (body, self.headers.get("Content-Type", MANIFEST_TYPE))
                self.send(201, b"", "text/plain")

            def answer(self, head: bool) -> None:
                prefix = f"/v2/{REPO}/"
                path = self.path.split("?", 1)[0]
                if path == "/v2/":
                    return self.send(200, b"{}", "application/json", head)
                rest = path[len(prefix):] if path.startswith(prefix) else None
                if rest in owner.lies:
                    return owner.lies[rest](self)
                kind, _, name = (rest or "").partition("/")
                if kind == "manifests" and name in owner.manifests:
                    body, media_type = owner.manifests[name]
                    return self.send(200, body, media_type, head)
                if kind == "blobs" and name in owner.blobs:
                    return self.send(200, owner.blobs[name], "application/octet-stream", head)
                return self.send(404, b'{"errors":[{"code":"NOT_FOUND","message":"no such thing"}]}', "application/json", head)

            def send(self, status: int, body: bytes, media_type: str, head: bool = False, **headers) -> None:
                self.send_response(status)
                self.send_header("Content-Type", media_type)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k.replace("_", "-"), v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LyingRegistry:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=HOLD)

    def ref(self, tag: str = "v1") -> str:
        return f"{self.address}/{REPO}:{tag}"


def serve_json(doc_bytes: bytes, media_type: str = MANIFEST_TYPE):
    return lambda h: h.send(200, doc_bytes, media_type)


def drip(size: int, every: float):
    """A body of ``size`` bytes sent one byte every ``every`` seconds (for at most HOLD seconds)."""

    def handler(h) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(size))
        h.end_headers()
        end = time.monotonic() + HOLD
        try:
            for _ in range(size):
                if time.monotonic() > end or h.server_release.wait(every):
                    break
                h.wfile.write(b"x")
                h.wfile.flush()
        except OSError:
            pass  # the client gave up, as it should
        h.close_connection = True

    return handler


def stall(first: bytes = b"x" * 100, size: int = 10_000):
    """Headers and a few bytes of a body, then silence (for at most HOLD seconds)."""

    def handler(h) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(size))
        h.end_headers()
        try:
            h.wfile.write(first)
            h.wfile.flush()
        except OSError:
            return
        h.server_release.wait(HOLD)
        h.close_connection = True

    return handler


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def concord_home(tmp_path_factory):
    """A home of the module's own: the exports' digest memo goes there, never into ``./data``."""
    with patched_environ({"CONCORD_HOME": str(tmp_path_factory.mktemp("concord-home"))}):
        yield


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """A signed toy snapshot exported to a real registry, then read back as its mirror: what a
    faithful registry would serve (manifests and blobs), and the pieces to forge with."""
    base = tmp_path_factory.mktemp("genuine")
    ckpt = make_checkpoint(base / "ckpt")
    store = LocalDirStore(str(base / "store"))
    root = snapshot(ckpt, store, ref="m/toy", chunk_size=SMALL_CHUNK).root
    key = generate_key(base / "key.pem")
    sign_root(store, root, key, ref="m/toy")
    # another snapshot signed by the same key: its bundle is genuine, but for another root
    other = base / "other"
    shutil.copytree(ckpt, other)
    (other / "tokenizer.txt").write_text("another tokenizer\n")
    other_root = snapshot(other, store, chunk_size=SMALL_CHUNK).root
    _, other_bundle = sign_root(store, other_root, key)
    with patched_environ({"DOCKER_CONFIG": str(base / "none")}, CLEARED), running_registry(base / "data", base / "registry.log") as address:
        ref = f"{address}/{REPO}:v1"
        assert main(["export", "oci", str(store.root), "--ref", "m/toy", ref, "--plain-http", "--json"]) == 0
        get = lambda path, accept=MANIFEST_TYPE: requests.get(f"http://{address}/v2/{REPO}/{path}", headers={"Accept": accept}, timeout=10)  # noqa: E731
        manifest = get("manifests/v1").content
        digest = sha256(manifest)
        doc = json.loads(manifest)
        manifests = {"v1": (manifest, MANIFEST_TYPE), digest: (manifest, MANIFEST_TYPE)}
        blobs = {}
        for d in [doc["config"]] + doc["layers"]:
            blobs[d["digest"]] = get(f"blobs/{d['digest']}").content
        index = get(f"manifests/{digest.replace(':', '-')}", INDEX_TYPE).content
        manifests[digest.replace(":", "-")] = (index, INDEX_TYPE)
        sig_digest = json.loads(index)["manifests"][0]["digest"]
        sig_manifest = get(f"manifests/{sig_digest}").content
        manifests[sig_digest] = (sig_manifest, MANIFEST_TYPE)
        sig_doc = json.loads(sig_manifest)
        for d in [sig_doc["config"]] + sig_doc["layers"]:
            blobs[d["digest"]] = get(f"blobs/{d['digest']}").content
    return {
        "base": base, "ckpt": ckpt, "store": store, "root": root, "key": key, "pub": str(base / "key.pub.pem"),
        "manifests": manifests, "blobs": blobs, "digest": digest, "doc": doc, "sig_doc": sig_doc,
        "other_bundle": other_bundle, "bundle": blobs[sig_doc["layers"][0]["digest"]],
    }


@pytest.fixture
def liar(genuine, monkeypatch):
    with LyingRegistry(genuine["manifests"], genuine["blobs"]) as reg:
        monkeypatch.setenv("DOCKER_CONFIG", str(genuine["base"] / "none"))
        for name in CLEARED[:2]:
            monkeypatch.delenv(name, raising=False)
        yield reg


@pytest.fixture
def staging(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "staging"
    d.mkdir()
    monkeypatch.setenv("CONCORD_STAGING_DIR", str(d))
    return d


def cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def refused(capsys, *argv: str, exit_code: int) -> str:
    code, text = cli(capsys, *argv)
    assert code == exit_code and text.startswith("concord: error: ") and text.count("\n") == 1, (code, text)
    return text


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: the store exactly as it is."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def with_layers(genuine, change) -> bytes:
    doc = json.loads(json.dumps(genuine["doc"]))
    change(doc)
    return canonical(doc)


def attach(liar: LyingRegistry, genuine, bundle: bytes) -> None:
    """Make ``bundle`` the artifact's only signature referrer (filed under the genuine key id)."""
    sig = json.loads(json.dumps(genuine["sig_doc"]))
    sig["layers"][0]["digest"], sig["layers"][0]["size"] = sha256(bundle), len(bundle)
    body = canonical(sig)
    liar.blobs[sha256(bundle)] = bundle
    liar.manifests[sha256(body)] = (body, MANIFEST_TYPE)
    index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [
        {"mediaType": MANIFEST_TYPE, "digest": sha256(body), "size": len(body), "artifactType": SIGNATURE_TYPE}]}
    liar.lies[f"referrers/{genuine['digest']}"] = serve_json(canonical(index), INDEX_TYPE)


def forged(bundle: bytes) -> bytes:
    """The bundle with one bit of its signature flipped: it parses, names the same key and root,
    and does not verify."""
    doc = json.loads(bundle)
    sig = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
    sig[len(sig) // 2] ^= 0x01
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    return json.dumps(doc, indent=1).encode() + b"\n"


# --------------------------------------------------------------------------- wrong shapes


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


SHAPES = {
    # a manifest nested far deeper than any (json.loads would recurse until it fails)
    "deep manifest": (lambda g: {"manifests/v1": serve_json(_deep(100_000))}, "nested deeper"),
    # a list where the chunk size string belongs
    "chunk size a list": (lambda g: {"manifests/v1": serve_json(with_layers(g, lambda d: d["annotations"].update({mp.CHUNK_SIZE: [1]})))}, "not a chunk size"),
    # a file path thousands of folders deep
    "deep path": (
        lambda g: {"manifests/v1": serve_json(with_layers(g, lambda d: d["layers"][0]["annotations"].update({mp.FILEPATH: "a/" * 5000 + "x.bin"})))},
        "deeper than",
    ),
    # a list where the referrers index (an object) belongs
    "referrers a list": (lambda g: {f"referrers/{g['digest']}": serve_json(b"[1, 2]", INDEX_TYPE)}, "top level is an array"),
    # a referrers index nested far deeper than any
    "deep referrers": (lambda g: {f"referrers/{g['digest']}": serve_json(b'{"manifests":' + _deep(50_000) + b"}", INDEX_TYPE)}, "nested deeper"),
}


@pytest.mark.parametrize("lie", sorted(SHAPES))
def test_a_document_of_the_wrong_shape_is_one_line_and_creates_no_store(lie, genuine, liar, staging, tmp_path, capsys):
    lies, says = SHAPES[lie]
    liar.lies.update(lies(genuine))
    target = tmp_path / "target"
    text = refused(capsys, "import", "oci", liar.ref(), "--store", str(target), "--ref", "m/toy", "--plain-http", exit_code=1)
    assert says in text
    assert not target.exists() and not os.listdir(staging)


@pytest.mark.parametrize("field, value", [("subject", "sha256:0"), ("layers", ["not a layer"]), ("annotations", [1])])
def test_a_signature_manifest_of_the_wrong_shape_is_one_line(field, value, genuine, liar, staging, tmp_path, capsys):
    sig = json.loads(json.dumps(genuine["sig_doc"]))
    sig[field] = value
    body = canonical(sig)
    liar.manifests[sha256(body)] = (body, MANIFEST_TYPE)
    index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [
        {"mediaType": MANIFEST_TYPE, "digest": sha256(body), "size": len(body), "artifactType": SIGNATURE_TYPE}]}
    liar.lies[f"referrers/{genuine['digest']}"] = serve_json(canonical(index), INDEX_TYPE)
    target = tmp_path / "target"
    text = refused(capsys, "import", "oci", liar.ref(), "--store", str(target), "--plain-http", exit_code=1)
    assert "is not what the distribution API sends" in text and field in text
    assert not target.exists() and not os.listdir(staging)


# --------------------------------------------------------------------------- slow, stalled, inflated


def test_a_dripping_layer_meets_its_deadline_and_leaves_no_staging(genuine, liar, staging, tmp_path, capsys, monkeypatch):
    layer = next(x for x in genuine["doc"]["layers"] if x["annotations"][mp.FILEPATH] == "tokenizer.txt")
    liar.lies[f"blobs/{layer['digest']}"] = drip(layer["size"], every=0.05)
    # a deadline of a second or so for the whole layer, whatever its size
    monkeypatch.setattr(oci_registry, "REQUEST_DEADLINE", 1.0)
    monkeypatch.setattr(oci_registry, "MIN_RATE", 10**12)
    target = tmp_path / "target"
    text = refused(capsys, "import", "oci", liar.ref(), "--store", str(target), "--plain-http", exit_code=14)
    assert f"blob {layer['digest']} did not arrive within its 1 s deadline" in text
    assert not target.exists() and not os.listdir(staging)


def test_a_stalled_layer_meets_its_read_timeout_and_leaves_no_staging(genuine, liar, staging, tmp_path, capsys, monkeypatch):
    layer = next(x for x in genuine["doc"]["layers"] if x["annotations"][mp.FILEPATH] == "model.safetensors")
    liar.lies[f"blobs/{layer['digest']}"] = stall(size=layer["size"])
    monkeypatch.setattr(oci_registry, "READ_TIMEOUT", 0.5)
    target = tmp_path / "target"
    text = refused(capsys, "import", "oci", liar.ref(), "--store", str(target), "--plain-http", exit_code=14)
    assert "did not arrive" in text and layer["digest"] in text
    assert not target.exists() and not os.listdir(staging)


def test_a_gzip_bomb_is_inflated_no_further_than_a_document_may_be(genuine, liar, staging, tmp_path, capsys):
    bomb = gzip.compress(b'{"manifests":[' + b" " * (64 * 1024 * 1024) + b"]}", compresslevel=9)
    assert len(bomb) < 1024 * 1024  # small on the wire, 64 MiB inflated

    def answer(h) -> None:
        h.send(200, bomb, INDEX_TYPE, Content_Encoding="gzip")

    liar.lies[f"referrers/{genuine['digest']}"] = answer
    target = tmp_path / "target"
    text = refused(capsys, "import", "oci", liar.ref(), "--store", str(target), "--plain-http", exit_code=1)
    assert f"larger than {oci_registry.MAX_DOCUMENT} bytes" in text
    assert not target.exists() and not os.listdir(staging)


def test_sigterm_during_a_stalled_layer_removes_the_staging_folder(genuine, liar, staging, tmp_path):
    layer = next(x for x in genuine["doc"]["layers"] if x["annotations"][mp.FILEPATH] == "model.safetensors")
    liar.lies[f"blobs/{layer['digest']}"] = stall(size=layer["size"])
    target = tmp_path / "target"
    proc = subprocess.Popen(
        [sys.executable, "-m", "concord.cli", "import", "oci", liar.ref(), "--store", str(target), "--plain-http"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "CONCORD_STAGING_DIR": str(staging)},
    )
    try:
        # the import is inside the stalled layer once its partial file is there
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(p.name == "model.safetensors" for p in staging.rglob("*")):
            assert proc.poll() is None, proc.communicate(timeout=10)
            time.sleep(0.05)
        assert any(p.name == "model.safetensors" for p in staging.rglob("*"))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 130 and b"interrupted" in err
    assert not os.listdir(staging) and not target.exists()


def test_a_layer_that_breaks_off_and_503_bursts_are_retried(genuine, liar, staging, tmp_path, capsys):
    """The first answer for a layer breaks off half way, the first two for the manifest are 503:
    the import tries again and brings the genuine root."""
    layer = next(x for x in genuine["doc"]["layers"] if x["annotations"][mp.FILEPATH] == "model.safetensors")
    body = genuine["blobs"][layer["digest"]]
    manifest = genuine["manifests"]["v1"][0]
    seen = {"layer": 0, "manifest": 0}

    def broken_then_whole(h) -> None:
        seen["layer"] += 1
        if seen["layer"] > 1:
            return h.send(200, body, "application/octet-stream")
        h.send_response(200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body[: len(body) // 2])
        h.wfile.flush()
        h.close_connection = True  # the connection ends half way through the body

    def busy_then_ok(h) -> None:
        seen["manifest"] += 1
        if seen["manifest"] <= 2:
            return h.send(503, b'{"errors":[{"code":"UNAVAILABLE","message":"busy"}]}', "application/json")
        h.send(200, manifest, MANIFEST_TYPE)

    liar.lies[f"blobs/{layer['digest']}"] = broken_then_whole
    liar.lies["manifests/v1"] = busy_then_ok
    target = tmp_path / "target"
    code, text = cli(capsys, "import", "oci", liar.ref(), "--store", str(target), "--ref", "m/toy", "--plain-http")
    assert code == 0, text
    assert LocalDirStore(str(target)).read_ref("m/toy").root == genuine["root"]
    assert seen == {"layer": 2, "manifest": 3} and not os.listdir(staging)


# --------------------------------------------------------------------------- signatures


def _imported_with_a_valid_signature(genuine, liar, tmp_path, capsys) -> Path:
    target = tmp_path / "target"
    code, text = cli(capsys, "import", "oci", liar.ref(), "--store", str(target), "--ref", "m/toy", "--trust", genuine["pub"], "--plain-http")
    assert code == 0, text
    sig = target / "signatures" / genuine["root"] / f"{genuine['key'].id}.sig"
    assert sig.read_bytes() == genuine["bundle"]
    return target


def test_a_signature_that_does_not_verify_under_trust_leaves_the_store_exactly_as_it_was(genuine, liar, staging, tmp_path, capsys):
    target = _imported_with_a_valid_signature(genuine, liar, tmp_path, capsys)
    before = tree(target)
    attach(liar, genuine, forged(genuine["bundle"]))
    text = refused(capsys, "import", "oci", liar.ref(), "--store", str(target), "--ref", "m/again", "--trust", genuine["pub"],
                   "--plain-http", exit_code=13)
    assert "does not verify" in text
    assert tree(target) == before and not os.listdir(staging)


def test_a_signature_the_store_holds_is_never_replaced_by_an_import(genuine, liar, staging, tmp_path, capsys):
    target = _imported_with_a_valid_signature(genuine, liar, tmp_path, capsys)
    attach(liar, genuine, forged(genuine["bundle"]))  # without a policy, nothing can tell it from a re-signing
    code, text = cli(capsys, "import", "oci", liar.ref(), "--store", str(target), "--ref", "m/again", "--plain-http")
    assert code == 0, text
    sig = target / "signatures" / genuine["root"] / f"{genuine['key'].id}.sig"
    assert sig.read_bytes() == genuine["bundle"]
    code, text = cli(capsys, "verify", str(target), "--ref", "m/again", "--trust", genuine["pub"])
    assert code == 0, text


def test_a_signature_of_another_root_is_refused_and_creates_no_store(genuine, liar, staging, tmp_path, capsys):
    attach(liar, genuine, genuine["other_bundle"])
    target = tmp_path / "target"
    text = refused(capsys, "import", "oci", liar.ref(), "--store", str(target), "--ref", "m/toy", "--plain-http", exit_code=13)
    assert f"not {genuine['root']}" in text
    assert not target.exists() and not os.listdir(staging)


# --------------------------------------------------------------------------- export publishes checked bytes only


def test_export_never_reuses_a_digest_the_registry_names_for_a_file(genuine, tmp_path, capsys):
    """A tag whose manifest names, for this very file hash, another blob of the same size: the
    export publishes the digest of the file's own bytes, never that blob."""
    store = genuine["store"]
    with patched_environ({"DOCKER_CONFIG": str(tmp_path / "none")}, CLEARED), running_registry(tmp_path / "data", tmp_path / "registry.log") as address:
        ref = f"{address}/{REPO}:v1"
        assert cli(capsys, "export", "oci", str(store.root), "--ref", "m/toy", ref, "--plain-http")[0] == 0
        reg = Registry(parse_reference(ref), plain_http=True)
        doc, _ = reg.get_manifest("v1")
        doc = json.loads(doc)
        layer = next(x for x in doc["layers"] if x["annotations"][mp.FILEPATH] == "tokenizer.txt")
        genuine_bytes = (genuine["ckpt"] / "tokenizer.txt").read_bytes()
        evil = bytes(b ^ 0x20 for b in genuine_bytes)
        reg.put_blob(sha256(evil), len(evil), lambda: [evil])
        layer["digest"] = sha256(evil)
        reg.put_manifest(canonical(doc), "v1")
        code, text = cli(capsys, "export", "oci", str(store.root), "--ref", "m/toy", ref, "--plain-http")
        assert code == 0, text
        pushed = json.loads(reg.get_manifest("v1")[0])
        layer = next(x for x in pushed["layers"] if x["annotations"][mp.FILEPATH] == "tokenizer.txt")
        assert layer["digest"] == sha256(genuine_bytes)
        assert reg.read_blob(layer["digest"], len(genuine_bytes)) == genuine_bytes
        reg.close()


def test_a_wrong_memo_entry_never_uploads_bytes_under_a_digest_not_theirs(genuine, tmp_path, monkeypatch, capsys):
    """A registry that keeps whatever it is sent under the digest it is told, and a memo entry
    that names the wrong digest for the tokenizer: the upload is stopped before its last block,
    the file hashed afresh, and the registry ends up with the tokenizer under its own digest."""
    store, root, ckpt = genuine["store"], genuine["root"], genuine["ckpt"]
    monkeypatch.setenv("CONCORD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCKER_CONFIG", str(genuine["base"] / "none"))
    tokenizer = load_manifest(store, root).by_path["tokenizer.txt"]
    genuine_bytes = (ckpt / "tokenizer.txt").read_bytes()
    lie = sha256(bytes(b ^ 0x20 for b in genuine_bytes))
    with LyingRegistry({}, {}) as lax:
        assert cli(capsys, "export", "oci", str(store.root), "--ref", root, lax.ref(), "--plain-http")[0] == 0
    memo = DigestMemo(tmp_path / "home" / MEMO_DIR)
    assert memo.get(content_key(tokenizer), tokenizer.size) == sha256(genuine_bytes)
    memo.put(content_key(tokenizer), tokenizer.size, lie)
    memo.save()
    with LyingRegistry({}, {}) as lax:
        code, text = cli(capsys, "export", "oci", str(store.root), "--ref", root, lax.ref(), "--plain-http")
        assert code == 0, text
        assert lie not in lax.blobs
        layer = next(x for x in json.loads(lax.manifests["v1"][0])["layers"] if x["annotations"][mp.FILEPATH] == "tokenizer.txt")
        assert layer["digest"] == sha256(genuine_bytes) and lax.blobs[layer["digest"]] == genuine_bytes
        for path in ("config.json", "model.safetensors"):  # the honest entries were used, and held
            d = next(x for x in json.loads(lax.manifests["v1"][0])["layers"] if x["annotations"][mp.FILEPATH] == path)["digest"]
            assert lax.blobs[d] == (ckpt / path).read_bytes()
    assert DigestMemo(tmp_path / "home" / MEMO_DIR).get(content_key(tokenizer), tokenizer.size) == sha256(genuine_bytes)


def test_export_refuses_a_store_signature_that_does_not_hold_and_pushes_nothing(genuine, tmp_path, capsys):
    """A bundle of another root copied under this root's signatures: the export refuses before
    any manifest is pushed."""
    src = genuine["store"]
    store = LocalDirStore(str(tmp_path / "copy"))
    for rel, data in tree(Path(src.root)).items():
        if not rel.startswith("signatures/"):
            (Path(store.root) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(store.root) / rel).write_bytes(data)
    store.put_document(f"signatures/{genuine['root']}/{genuine['key'].id}.sig", genuine["other_bundle"])
    with patched_environ({"DOCKER_CONFIG": str(tmp_path / "none")}, CLEARED), running_registry(tmp_path / "data", tmp_path / "registry.log") as address:
        ref = f"{address}/{REPO}:v1"
        text = refused(capsys, "export", "oci", str(store.root), "--ref", "m/toy", ref, "--plain-http", exit_code=13)
        assert f"not {genuine['root']}" in text
        r = requests.get(f"http://{address}/v2/{REPO}/manifests/v1", headers={"Accept": MANIFEST_TYPE}, timeout=10)
        assert r.status_code == 404
