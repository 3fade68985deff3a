"""Credentials in URLs are hidden wherever Concord shows an address."""

from __future__ import annotations

import pytest

from concord.errors import StoreUnreachableError
from concord.redact import redact, redact_url


@pytest.mark.parametrize(
    "text, shown",
    [
        ("http://alice:s3cr3t@127.0.0.1:9000", "http://alice:***@127.0.0.1:9000"),
        ("at https://tok3n@minio.internal/b failed", "at https://***@minio.internal/b failed"),
        ('URL: "http://a:p@ss@h:1/bucket"', 'URL: "http://a:***@h:1/bucket"'),  # an '@' in the password
        ("http://:pw@h", "http://***@h"),
        ("s3://bucket/pre@fix and me@example.org", "s3://bucket/pre@fix and me@example.org"),
        ("http://h/p@q", "http://h/p@q"),
        ("no url here", "no url here"),
    ],
)
def test_redact(text, shown):
    assert redact(text) == shown


def test_redact_url_and_errors():
    assert redact_url(None) is None
    err = StoreUnreachableError("s3://b/p", "list at http://alice:s3cr3t@h:1 failed")
    assert "s3cr3t" not in str(err) and "alice:***@h:1" in str(err)


def test_a_block_endpoint_refused_is_named_without_its_password():
    from concord_pipelines.blocks.stores import S3Store

    with pytest.raises(ValueError) as info:
        S3Store(bucket="some-bucket", endpoint_url="ftp://alice:s3cr3t@minio:9000")
    assert "s3cr3t" not in str(info.value) and "alice:***@minio" in str(info.value)


def test_a_block_shows_its_endpoint_without_the_password():
    from concord_pipelines.blocks.stores import S3Store

    block = S3Store(bucket="some-bucket", endpoint_url="http://alice:s3cr3t@minio:9000")
    assert "s3cr3t" not in repr(block) and "alice:***@minio:9000" in repr(block)
    assert block.endpoint_url == "http://alice:s3cr3t@minio:9000"  # used as given
    assert "s3cr3t" not in repr(block.get_store())
