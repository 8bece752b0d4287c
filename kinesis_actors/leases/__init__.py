"""Leases: the :class:`Lease` model, the :class:`LeaseStore` protocol and its stores.

- :class:`MemoryLeaseStore`: the rows in one Ray actor (one instance; empty after restart).
- :class:`DynamoLeaseStore`: the rows in a DynamoDB table (shared by instances, durable).
- :class:`KclLeaseStore`: an existing KCL 2.x/3.x application's lease table, in KCL's schema.

All three are one class of rules (:class:`~kinesis_actors.leases.rules.LeaseRules`) over
their own table (:class:`~kinesis_actors.leases.rows.LeaseTable`);
``kinesis_actors.testing.InProcessLeaseStore`` is the same rules with rows in this process.
"""

from .dynamodb import DynamoLeaseStore
from .kcl import KclLeaseStore
from .memory import MemoryLeaseStore
from .protocol import SHARD_END, Instance, Lease, LeaseStore

__all__ = ["Lease", "Instance", "LeaseStore", "SHARD_END", "MemoryLeaseStore", "DynamoLeaseStore",
           "KclLeaseStore"]
