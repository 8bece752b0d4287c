"""A chosen subset of the consume tests, run again with kinesalite as the Kinesis emulator
(56-digit sequence numbers, AWS-like iterators) and the lease table on moto's DynamoDB.

The test functions are those of ``test_consume``; this module only rebinds their
fixtures: ``endpoint`` is kinesalite here, and a ``DynamoLeaseStore`` given without an
endpoint is pinned to moto (a broker never overwrites a store's explicit endpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kinesis_actors.broker import KinesisBroker
from kinesis_actors.leases.dynamodb import DynamoLeaseStore

from . import test_consume as consume

pytestmark = [pytest.mark.kinesalite, pytest.mark.usefixtures("ray_session")]


@pytest.fixture
def endpoint(kinesalite: str) -> str:
    """Kinesis endpoint of these tests: kinesalite."""
    return kinesalite


@pytest.fixture
def make_broker(kinesalite: str, emulator: Any) -> Iterator[Callable[..., KinesisBroker]]:
    """Like ``test_consume.make_broker``, with Kinesis on kinesalite and leases on moto."""
    brokers: list[KinesisBroker] = []

    def make(**kwargs: Any) -> KinesisBroker:
        store = kwargs.get("lease_store")
        if isinstance(store, DynamoLeaseStore) and store.endpoint is None:
            kwargs["lease_store"] = DynamoLeaseStore(store.table, create_if_missing=store.dynamo.create_if_missing,
                                                     endpoint=emulator.endpoint, region="us-east-1",
                                                     test_credentials=True)
        options = {"endpoint": kinesalite, "region": "us-east-1", "test_credentials": True, **consume.FAST, **kwargs}
        broker = KinesisBroker(**options).connect()
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.shutdown()


test_latest_skips_records_published_before = consume.test_latest_skips_records_published_before
test_trim_horizon_delivers_everything_in_order = consume.test_trim_horizon_delivers_everything_in_order
test_at_timestamp = consume.test_at_timestamp
test_restart_on_dynamo_resumes_after_checkpoint = consume.test_restart_on_dynamo_resumes_after_checkpoint
test_two_brokers_sharing_a_table_split_shards_and_see_everything = (
    consume.test_two_brokers_sharing_a_table_split_shards_and_see_everything)
test_reader_replaced_before_first_checkpoint_with_latest_loses_nothing = (
    consume.test_reader_replaced_before_first_checkpoint_with_latest_loses_nothing)
