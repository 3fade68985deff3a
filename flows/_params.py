"""Parameter types shared by the flows, so that the Prefect UI's run forms validate what they can
(patterns, bounds) and a run started with a bad value fails before it does anything, naming the
parameter and what it takes."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from concord.errors import ConcordError
from concord.stores import check_store_address, split_ref

#: a name segment as stores take it (refs, data sets, audits)
SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}"


def _store(value: str) -> str:
    try:
        return check_store_address(value)
    except ConcordError as exc:  # pydantic reports ValueErrors with the parameter's name
        raise ValueError(str(exc)) from None


def _ref(value: str) -> str:
    try:
        split_ref(value)
    except ConcordError as exc:
        raise ValueError(f"{exc}; a ref is namespace/name, e.g. models/minilm") from None
    return value


StoreAddress = Annotated[
    str,
    Field(min_length=1, examples=["data/stores/us-east", "s3://bucket/prefix", "block:us-east"]),
    AfterValidator(_store),
]
"""A store: a folder (relative to the project folder runs start in), ``file:///path``,
``s3://bucket/prefix`` or ``block:NAME`` of a saved store block."""

RefName = Annotated[str, Field(pattern=rf"^({SEGMENT}/)?{SEGMENT}$", examples=["models/minilm"]), AfterValidator(_ref)]
"""A ref, ``namespace/name`` (a bare name is in the default namespace)."""

ModelName = Annotated[str, Field(pattern=r"^[^/\s][^/]*$", description="Registered model name in MLflow (no '/').")]
