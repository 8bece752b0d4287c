"""The lease-store contract suite on MemoryLeaseStore (its rows live in a Ray actor),
and the checks that a store works inside Ray tasks.

The contract tier (tests/contract) runs the same suite on the in-process and DynamoDB
stores without Ray; every test of it that takes a store of the parametrised ``kind``
runs here again with ``kind`` fixed to ``"memory"``.
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from kinesis_actors.errors import LeaseStoreError
from kinesis_actors.leases import Lease, MemoryLeaseStore
from tests.contract import test_balancing_contract, test_lease_store_contract
from tests.contract.test_lease_store_contract import (  # noqa: F401  (fixtures)
    DURATION_S,
    SEQ_56,
    SHARD,
    MakeStore,
    atomic_dynamo_endpoint,
    clock,
    make_store,
    store,
    stream,
)

_STORE_FIXTURES = {"kind", "store", "make_store"}


def _store_tests() -> dict[str, Any]:
    """The contract tests that take a store of the parametrised kind (not the DynamoDB specifics)."""
    found = {}
    for module in (test_lease_store_contract, test_balancing_contract):
        for name, func in vars(module).items():
            if name.startswith("test_") and callable(func) and _STORE_FIXTURES & set(inspect.signature(func).parameters):
                found[name] = func
    return found


globals().update(_store_tests())


@pytest.fixture
def kind() -> str:
    return "memory"


@pytest.fixture(scope="module")
def memory_table(ray_session: None) -> Iterator[MemoryLeaseStore]:
    """One MemoryLeaseStore actor for the module (a new actor costs ~1.5 s on 2 cores).

    Tests reach it through ``peer()`` copies (fresh observation tables) and use unique
    stream names, so they never see each other's rows.
    """
    table = MemoryLeaseStore().open()
    yield table
    table.close()


@pytest.mark.parametrize("store_kind", ["memory", "dynamodb"])
def test_store_works_inside_a_ray_task(store_kind: str, request: pytest.FixtureRequest, stream: str,
                                       unique: str) -> None:
    import ray

    request.getfixturevalue("ray_session")
    if store_kind == "memory":
        remote_store: Any = request.getfixturevalue("memory_table").peer()
    else:
        from kinesis_actors.leases import DynamoLeaseStore

        remote_store = DynamoLeaseStore(f"leases-{unique}-task", endpoint=request.getfixturevalue("endpoint"),
                                        region="us-east-1", test_credentials=True, create_if_missing=True)
    lease = remote_store.take(stream, SHARD, owner="a", duration_s=DURATION_S)

    def checkpoint_remotely(held_store: Any, held: Lease) -> Lease:
        return held_store.checkpoint(held, SEQ_56)

    task = ray.remote(num_cpus=0)(checkpoint_remotely)
    new = ray.get(task.remote(remote_store, lease), timeout=60)
    assert new.checkpoint == SEQ_56 and new.counter == lease.counter + 1
    assert remote_store.get(stream, SHARD) == new


def test_memory_store_closed_raises_lease_store_error(request: pytest.FixtureRequest, stream: str) -> None:
    request.getfixturevalue("ray_session")
    table = MemoryLeaseStore().open()
    other = pickle.loads(pickle.dumps(table))
    other.get(stream, SHARD)  # the copy has found the actor
    table.close()
    table.close()  # idempotent
    with pytest.raises(LeaseStoreError):
        table.get(stream, SHARD)
    with pytest.raises(LeaseStoreError) as info:
        other.get(stream, SHARD)
    assert not info.value.retriable
