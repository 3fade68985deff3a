"""An S3 endpoint given with credentials in its user-info (``http://user:secret@host:port``) is
used as given, and never shown with its password: not in error lines, CLI output, tracebacks or
a store's repr. Against a real moto_server, and against an endpoint nobody answers on."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from servers import free_port

from concord.errors import StoreAccessError, StoreUnreachableError
from concord.stores.s3 import S3ObjectStore

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Pa55"
CONCORD = str(Path(sys.executable).parent / "concord")


def _with_userinfo(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://alice:{SECRET}@{parts.netloc}"


def _cli(*argv: str, endpoint: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint)
    return subprocess.run([CONCORD, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


@pytest.fixture
def unreachable() -> str:
    return f"http://alice:{SECRET}@127.0.0.1:{free_port()}"


def test_an_endpoint_with_credentials_works_and_its_password_is_never_printed(moto_server, tmp_path):
    endpoint = _with_userinfo(moto_server)
    bucket = f"redact-{uuid.uuid4().hex[:12]}"
    store = S3ObjectStore(bucket, "p", endpoint_url=endpoint, create_bucket=True)
    store.list_refs()  # the bucket is created through the endpoint with user-info
    assert SECRET not in repr(store) and "alice:***@" in repr(store)

    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    done = _cli("snapshot", str(src), "--store", f"s3://{bucket}/p", "--ref", "m/x", endpoint=endpoint, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    refs = _cli("refs", f"s3://{bucket}/p", endpoint=endpoint, cwd=tmp_path)
    assert refs.returncode == 0 and "m/x" in refs.stdout, refs.stderr
    assert SECRET not in done.stdout + done.stderr + refs.stdout + refs.stderr

    # an error about this endpoint (a bucket that is not there) names it without the password
    missing = _cli("refs", f"s3://{bucket}-missing/p", endpoint=endpoint, cwd=tmp_path)
    assert missing.returncode == 10  # no store there
    assert len(missing.stderr.splitlines()) == 1, missing.stderr
    assert SECRET not in missing.stderr and "alice:***@127.0.0.1" in missing.stderr, missing.stderr

    with pytest.raises(StoreAccessError) as info:
        S3ObjectStore(f"{bucket}-missing", "p", endpoint_url=endpoint).list_refs()
    shown = "".join(traceback.format_exception(info.value))
    assert SECRET not in shown and "alice:***@" in str(info.value)


def test_an_unreachable_endpoint_with_credentials_is_named_without_its_password(aws_credentials, unreachable, tmp_path):
    store = S3ObjectStore("some-bucket", "p", endpoint_url=unreachable, max_attempts=1, connect_timeout=2)
    with pytest.raises(StoreUnreachableError) as info:
        store.list_refs()
    shown = "".join(traceback.format_exception(info.value))  # what a task's log would show, causes included
    assert SECRET not in shown, shown
    port = urlsplit(unreachable).port
    assert f"http://alice:***@127.0.0.1:{port}" in str(info.value)
    assert SECRET not in repr(store)

    done = _cli("refs", "s3://some-bucket/p", endpoint=unreachable, cwd=tmp_path)
    assert done.returncode == 14 and done.stdout == ""  # 14: unreachable
    (line,) = done.stderr.splitlines()
    assert line.startswith("concord: error: ") and "unreachable" in line, line
    assert SECRET not in line and f"127.0.0.1:{port}" in line, line
