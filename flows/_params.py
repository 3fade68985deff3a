"""Parameter types shared by the flows, so that the Prefect UI's run forms validate what they can
(patterns, bounds) and a run started with a bad value fails before it does anything, naming the
parameter and what it takes."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from concord.errors import ConcordError
from concord.stores import split_ref
from concord.stores.address import StoreAddress as Address
from concord.stores.base import NAME_SEGMENT

#: a name as stores take it (a ref's part, a tenant, a data set, an audit, a checkpoint). Compiled,
#: so that pydantic checks it with Python's ``re`` (its own engine has no look-ahead, which the
#: no-'..' rule needs); the run form gets its text, and a browser's regular expressions take it.
NAME_PATTERN = re.compile(rf"^{NAME_SEGMENT}$")


def _store(value: str) -> str:
    try:
        return Address.parse(value).text
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

RefName = Annotated[
    str, Field(pattern=re.compile(rf"^({NAME_SEGMENT}/)?{NAME_SEGMENT}$"), examples=["models/minilm"]), AfterValidator(_ref)
]
"""A ref, ``namespace/name`` (a bare name is in the default namespace)."""

ModelName = Annotated[str, Field(pattern=r"^[^/\s][^/]*$", description="Registered model name in MLflow (no '/').")]
