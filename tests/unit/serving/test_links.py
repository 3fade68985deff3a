"""Checkout beside a serving link: reuse, the flip, rollback, status, pruning, the health gate,
the cache shared by the nodes of a host, and bad input (a real folder, a foreign link, a lock held)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from toy_checkpoints import SMALL_CHUNK, files_equal, fine_tune

from concord.cli import main
from concord.errors import (
    CheckoutBusyError,
    CheckoutTargetError,
    HealthCheckFailedError,
    NoPreviousVersionError,
    RefNotFoundError,
)
from concord.serving.checkout import checkout
from concord.serving.health import HealthCheck
from concord.serving.versions import Layout, rollback, status
from concord.snapshots.diff import diff_manifests
from concord.snapshots.snapshot import snapshot
from concord.stores import LocalDirStore

CHANGED = ["layers.0.attn.q.weight", "layers.2.attn.k.weight"]


@pytest.fixture
def versions(ckpt, tmp_path):
    """A store holding two versions of the toy checkpoint (the second with two tensors changed)."""
    store = LocalDirStore(tmp_path / "store")
    v2 = fine_tune(ckpt, tmp_path / "v2", CHANGED)
    a = snapshot(ckpt, store, chunk_size=SMALL_CHUNK, ref="models/toy")
    b = snapshot(v2, store, chunk_size=SMALL_CHUNK, ref="models/toy")
    return store, (ckpt, a.manifest), (v2, b.manifest)


def test_second_checkout_fetches_only_the_changed_bytes_and_flips(versions, tmp_path):
    store, (d1, m1), (d2, m2) = versions
    dest = tmp_path / "srv" / "current"
    first = checkout(store, m1, dest)
    assert first.switched and first.previous is None and first.bytes == m1.total_bytes
    assert first.bytes_fetched + first.bytes_reused == m1.total_bytes  # every byte written once
    assert files_equal(dest, d1)
    assert os.readlink(dest) == f".current.versions/{m1.root}"

    second = checkout(store, m2, dest)
    changed = diff_manifests(m1, m2).bytes_differing
    assert second.previous == m1.root and second.root == m2.root
    assert 0 < second.bytes_fetched == changed
    assert second.bytes_reused == m2.total_bytes - changed
    assert files_equal(dest, d2)
    assert files_equal(Layout.of(dest).version_dir(m1.root), d1)  # the old version is untouched

    again = checkout(store, m2, dest)
    assert not again.switched and again.bytes_fetched == again.bytes_reused == 0


def test_rollback_restores_the_previous_bytes_and_status_says_which_is_current(versions, tmp_path):
    store, (d1, m1), (d2, m2) = versions
    dest = tmp_path / "current"
    with pytest.raises(NoPreviousVersionError):
        rollback(dest)
    checkout(store, m1, dest)
    with pytest.raises(NoPreviousVersionError):
        rollback(dest)
    checkout(store, m2, dest)
    s = status(dest)
    assert (s.current, s.previous) == (m2.root, m1.root)
    assert [(v.root, v.current, v.previous, v.bytes) for v in s.versions] == [
        (m2.root, True, False, m2.total_bytes), (m1.root, False, True, m1.total_bytes),
    ]
    r = rollback(dest)
    assert (r.root, r.previous) == (m1.root, m2.root)
    assert files_equal(dest, d1)
    assert status(dest).previous == m2.root  # and forward again
    rollback(dest)
    assert files_equal(dest, d2)


def test_a_kept_version_checked_out_again_is_reverified_and_repaired(versions, tmp_path):
    store, (d1, m1), (d2, m2) = versions
    dest = tmp_path / "current"
    checkout(store, m1, dest)
    checkout(store, m2, dest)
    part = m1.by_path["model.safetensors"].by_key[("tensor", CHANGED[0])]  # a chunk only m1 holds
    damaged = Path(Layout.of(dest).version_dir(m1.root)) / "model.safetensors"
    data = bytearray(damaged.read_bytes())
    data[part.offset + 10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    r = checkout(store, m1, dest)
    assert r.bytes_fetched == min(SMALL_CHUNK, part.length)  # the one damaged chunk, fetched again
    assert r.bytes_reused == m1.total_bytes - r.bytes_fetched
    assert files_equal(dest, d1)


def test_a_changed_byte_in_the_served_version_is_fetched_not_copied(versions, tmp_path):
    store, (d1, m1), (d2, m2) = versions
    dest = tmp_path / "current"
    checkout(store, m1, dest)
    served = Path(Layout.of(dest).version_dir(m1.root)) / "config.json"
    before = served.stat()
    served.write_bytes(served.read_bytes().replace(b"96", b"97"))
    os.utime(served, ns=(before.st_atime_ns, before.st_mtime_ns))  # its mtime set back: the ctime still tells
    r = checkout(store, m2, dest)
    assert r.bytes_fetched == diff_manifests(m1, m2).bytes_differing + served.stat().st_size
    assert files_equal(dest, d2)


def test_keep_prunes_older_versions_but_never_the_current_or_the_one_before(ckpt, tmp_path):
    store = LocalDirStore(tmp_path / "store")
    manifests = []
    for i in range(4):
        src = fine_tune(ckpt, tmp_path / f"v{i}", ["layers.1.norm.weight"], delta=0.5 * (i + 1))
        manifests.append(snapshot(src, store, chunk_size=SMALL_CHUNK).manifest)
    dest = tmp_path / "current"
    for m in manifests[:3]:
        checkout(store, m, dest)
    r = checkout(store, manifests[3], dest, keep=1)
    assert set(r.pruned) == {manifests[0].root, manifests[1].root}
    assert Layout.of(dest).versions() == sorted([manifests[3].root, manifests[2].root])
    assert not os.path.exists(Layout.of(dest).manifest_path(manifests[0].root))
    assert rollback(dest).root == manifests[2].root


def test_a_failing_health_gate_flips_back(versions, tmp_path):
    store, (d1, m1), (d2, m2) = versions
    dest = tmp_path / "current"
    with pytest.raises(HealthCheckFailedError, match="removed"):
        checkout(store, m1, dest, health=HealthCheck(cmd="exit 3"))
    assert not os.path.lexists(dest)  # it served nothing before, and serves nothing now
    checkout(store, m1, dest, health=HealthCheck(cmd='test "$CONCORD_CHECKOUT_ROOT" = "$(basename "$(readlink "$CONCORD_CHECKOUT_PATH")")"'))
    gate = HealthCheck(cmd=f'grep -q {m1.root} "$CONCORD_CHECKOUT_PATH/../missing" || {{ echo unhealthy >&2; exit 1; }}')
    with pytest.raises(HealthCheckFailedError, match="unhealthy") as caught:
        checkout(store, m2, dest, health=gate)
    assert caught.value.restored == m1.root
    assert files_equal(dest, d1)
    assert [e["action"] for e in Layout.of(dest).history()] == ["checkout", "health-rollback", "checkout", "checkout", "health-rollback"]


def test_a_health_url_that_answers_500_flips_back(versions, tmp_path):
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/ok" else 500)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store, (d1, m1), (d2, m2) = versions
        dest = tmp_path / "current"
        base = f"http://127.0.0.1:{server.server_port}"
        checkout(store, m1, dest, health=HealthCheck(url=f"{base}/ok"))
        with pytest.raises(HealthCheckFailedError, match="HTTP 500"):
            checkout(store, m2, dest, health=HealthCheck(url=f"{base}/fail", attempts=2, interval=0.01))
        assert files_equal(dest, d1)
    finally:
        server.shutdown()


def test_nodes_of_one_host_share_downloads_through_a_cache(versions, tmp_path):
    store, (d1, m1), _ = versions
    cache = LocalDirStore(tmp_path / "cache")
    a = checkout(store, m1, tmp_path / "node-a" / "current", cache=cache)
    b = checkout(store, m1, tmp_path / "node-b" / "current", cache=cache)
    assert a.bytes_fetched + a.bytes_reused == m1.total_bytes and a.bytes_from_cache == 0
    assert b.bytes_fetched == 0 and b.bytes_from_cache == a.bytes_fetched
    assert files_equal(tmp_path / "node-b" / "current", d1)


def test_a_real_folder_or_a_foreign_link_is_refused_and_left_alone(versions, tmp_path):
    store, (d1, m1), _ = versions
    real = tmp_path / "real"
    real.mkdir()
    (real / "model.bin").write_bytes(b"served by hand")
    with pytest.raises(CheckoutTargetError, match="real folder.*to adopt it"):
        checkout(store, m1, real)
    assert (real / "model.bin").read_bytes() == b"served by hand"
    assert not (tmp_path / ".real.versions").exists()
    foreign = tmp_path / "foreign"
    foreign.symlink_to(real)
    with pytest.raises(CheckoutTargetError, match="not to a version Concord checked out"):
        checkout(store, m1, foreign)
    with pytest.raises(CheckoutTargetError):
        rollback(foreign)
    assert os.readlink(foreign) == str(real)


def test_a_second_checkout_of_one_link_waits_or_fails_cleanly(versions, tmp_path):
    store, (d1, m1), (d2, m2) = versions
    dest = tmp_path / "current"
    checkout(store, m1, dest)
    layout = Layout.of(dest)
    with layout.locked():
        with pytest.raises(CheckoutBusyError, match="another checkout"):
            checkout(store, m2, dest, wait=0.2)
        assert os.readlink(dest) == layout.target(m1.root)
    results = []
    threads = [threading.Thread(target=lambda m=m: results.append(checkout(store, m, dest).root)) for m in (m2, m1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted([m1.root, m2.root])
    assert os.readlink(dest) in (layout.target(m1.root), layout.target(m2.root))


def test_cli_checkout_json_status_rollback_and_bad_input(versions, tmp_path, capsys):
    store, (d1, m1), (d2, m2) = versions
    dest = str(tmp_path / "srv" / "current")
    assert main(["checkout", store.uri, "--ref", "models/toy~1", dest, "--json"]) == 0
    assert main(["checkout", store.uri, "--ref", "models/toy", dest, "--keep", "2", "--json"]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"root", "path", "bytes", "bytes_fetched", "bytes_reused", "previous", "seconds"} <= set(out[1])
    assert (out[0]["root"], out[1]["root"], out[1]["previous"]) == (m1.root, m2.root, m1.root)
    assert main(["checkout", "--status", dest, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["current"], st["previous"]) == (m2.root, m1.root)
    assert main(["checkout", "--rollback", dest]) == 0
    assert "rolled back" in capsys.readouterr().out
    assert files_equal(Path(dest), d1)
    assert main(["checkout", store.uri, "--ref", "models/nope", dest]) == 10
    assert "no ref 'models/nope'" in capsys.readouterr().err
    assert main(["checkout", str(tmp_path / "no-store"), "--ref", "models/toy", dest]) == 10
    assert "no-store" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert main(["checkout", store.uri, "--ref", "models/toy", str(tmp_path / "plain")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "to adopt it" in err
    assert files_equal(Path(dest), d1)


def test_a_missing_ref_changes_nothing(versions, tmp_path):
    store, (d1, m1), _ = versions
    from concord.snapshots.refs import resolve_root

    with pytest.raises(RefNotFoundError):
        resolve_root(store, "models/absent")


def test_under_a_trust_policy_an_unsigned_root_is_never_written(versions, tmp_path, capsys):
    from concord.errors import UntrustedRootError
    from concord.trust import TrustPolicy, generate_key, sign_root

    store, (d1, m1), (d2, m2) = versions
    key = generate_key(tmp_path / "keys" / "release.pem")
    sign_root(store, m1.root, key)
    policy = TrustPolicy.from_paths([tmp_path / "keys" / "release.pub.pem"])
    dest = tmp_path / "current"
    assert checkout(store, m1, dest, trust=policy).switched
    with pytest.raises(UntrustedRootError):
        checkout(store, m2, dest, trust=policy)
    layout = Layout.of(dest)
    assert layout.versions() == [m1.root] and not os.path.exists(layout.partial_dir(m2.root))
    assert main(["checkout", store.uri, "--root", m2.root, str(dest), "--trust", str(tmp_path / "keys" / "release.pub.pem")]) == 13
    assert m2.root in capsys.readouterr().err
    assert files_equal(dest, d1)


def test_the_serving_wing_loads_no_heavy_library_and_a_health_check_is_one_thing():
    import subprocess
    import sys

    code = (
        "import sys, concord.serving.checkout, concord.serving.versions, concord.serving.health, concord.cli.serving;"
        "bad = [m for m in ('prefect', 'torch', 'boto3', 'mlflow') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    for bad in (dict(), dict(cmd="true", url="http://127.0.0.1:1/"), dict(url="file:///etc/passwd"), dict(cmd="true", attempts=0)):
        with pytest.raises(ValueError):
            HealthCheck(**bad)
