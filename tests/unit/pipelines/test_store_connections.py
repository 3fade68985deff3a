"""How many transfers an S3 store runs at once is set on its block (``connections``), as on its
address (``?connections=N``), and checked before anything is opened."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from concord.stores.s3 import DEFAULT_CONNECTIONS, S3ObjectStore
from concord_pipelines.blocks.stores import S3Store


def test_the_block_passes_its_connections_to_the_store() -> None:
    store = S3Store(bucket="models", prefix="c1", connections=40).get_store()
    assert (store.connections, store.parallelism) == (40, 40)
    assert S3Store(bucket="models").get_store().parallelism == DEFAULT_CONNECTIONS
    assert "transfers" in S3Store.model_fields["connections"].description


@pytest.mark.parametrize("value", [0, -3, 1025])
def test_the_block_refuses_connections_out_of_range(value) -> None:
    with pytest.raises(ValidationError, match="connections"):
        S3Store(bucket="models", connections=value)


@pytest.mark.parametrize("value", [0, 1025, 2.5, True, "8"])
def test_the_store_refuses_connections_that_are_not_a_whole_number_in_range(value) -> None:
    with pytest.raises(ValueError, match="connections must be a whole number from 1 to 1024"):
        S3ObjectStore("models", "c1", connections=value)
