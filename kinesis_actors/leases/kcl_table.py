"""KclRows: a KCL application's DynamoDB lease table, as the table that
:class:`~kinesis_actors.leases.rules.LeaseRules` writes.

What it holds: the check of the table at first use (it must exist, keyed by ``leaseKey``;
it is never created, deleted or altered), the detection of its layout (single- or
multi-stream: KCL writes ``streamName`` on every lease row of a multi-stream table), the
mapping of our rows onto KCL's items and back (:mod:`~kinesis_actors.leases.kcl_rows`,
:mod:`~kinesis_actors.leases.kcl_update`) through a
:class:`~kinesis_actors.leases.dynamodb.DynamoRows` client, and the watch for a live KCL
worker: every row's ``leaseCounter`` and our ``kinesisActorsWriteToken`` are noted at each
read, and a counter raised without a new token of ours raises :class:`KclFleetLiveError`.
The store over it, and why a live mix of fleets is refused, is
:class:`~kinesis_actors.leases.kcl.KclLeaseStore`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import InvalidError, LeaseStoreError
from .dynamodb import DynamoRows, from_item, to_attr, to_item
from .kcl_rows import (
    A_TOKEN,
    K_COUNTER,
    K_KEY,
    K_SHARD_ID,
    K_STREAM_NAME,
    is_lease_item,
    item_to_row,
    multi_stream_identifier,
    new_item,
    stream_of_identifier,
)
from .kcl_update import kcl_update
from .rows import (
    COUNTER,
    DURATION_MS,
    EXPIRY,
    KEY,
    SHARD_ID,
    STREAM,
    STREAM_ARN,
    STREAM_CREATION_MS,
    Row,
    lease_key,
    validate_names,
)

__all__ = ["KclRows", "KclFleetLiveError"]

logger = logging.getLogger(__name__)

_DEFAULT_DURATION_MS = 10_000  # KCL's default failoverTimeMillis


class KclFleetLiveError(LeaseStoreError):
    """A KCL worker is renewing leases in the table this store reads: stop the KCL fleet first.

    ``fatal``: the Coordinator fails the subscription on it instead of retrying the poll.
    """

    fatal = True


class KclRows:
    """A KCL application's lease table as a :class:`~kinesis_actors.leases.rows.LeaseTable`.

    Translates our rows to KCL's items and back (``kcl_rows``, ``kcl_update``) through a
    :class:`~kinesis_actors.leases.dynamodb.DynamoRows` client, learns the table's layout
    (single- or multi-stream), and watches every row's counter for a live KCL worker.
    Holds no presence rows (``presence`` is False). Picklable.

    Args:
        dynamo: the client of the table (never used to create it).
        stream: the stream of a single-stream table, or None (bound at first use).
        multi_stream: the table's layout, or None to detect it at :meth:`ensure_table`.
    """

    presence = False

    def __init__(self, dynamo: DynamoRows, stream: str | None, multi_stream: bool | None) -> None:
        self.dynamo = dynamo
        self.stream = stream
        self.multi = multi_stream
        self.ready = False
        self.duration_ms = _DEFAULT_DURATION_MS  # failover time of rows without a take of ours
        self.live: str | None = None  # why a live KCL worker was seen, once it was
        self._stream_ids: dict[str, str] = {}  # multi-stream: stream name -> "account:stream:epoch"
        self._writes: dict[str, tuple[int, str | None]] = {}  # KCL key -> (counter, our token) last seen
        self._durations: dict[str, int] = {}  # our key -> duration of our last take or renew of it, ms

    @property
    def table(self) -> str:
        """The table name (the KCL application's name)."""
        return self.dynamo.table

    def peer(self, dynamo: DynamoRows | None = None) -> KclRows:
        """A copy for another store: same layout and stream ids, what it saw of our writes, no
        durations; over ``dynamo`` (default: the same client)."""
        other = object.__new__(KclRows)
        other.__dict__.update(self.__dict__)
        other.dynamo = dynamo if dynamo is not None else self.dynamo
        other._stream_ids, other._writes, other._durations = dict(self._stream_ids), dict(self._writes), {}
        return other

    def check_stream(self, stream: str) -> None:
        """Bind a single-stream table to ``stream`` (no I/O).

        Raises:
            InvalidError: a bad name, or a single-stream table bound to another stream.
        """
        validate_names(stream)
        if self.multi:
            return
        if self.stream is None:
            self.stream = stream
        elif stream != self.stream:
            raise InvalidError(f"KCL lease table {self.table!r} is a single-stream table of stream "
                               f"{self.stream!r}; it cannot lease shards of stream {stream!r}")

    def expect(self, stream: str, identity: tuple[str, int] | None) -> None:
        """Before a take: refuse a table with a live KCL worker; on a multi-stream table, key
        ``stream``'s rows by the incarnation ``identity`` names, if none is known yet.

        Raises:
            KclFleetLiveError: a live KCL worker was seen on the table.
        """
        if self.live is not None:
            raise KclFleetLiveError(self.live)
        if self.multi and identity is not None and stream not in self._stream_ids:
            identifier = multi_stream_identifier(stream, identity)
            if identifier is not None:
                self._stream_ids[stream] = identifier

    def ensure_table(self) -> None:
        """Check the table once (it must exist, keyed by ``leaseKey``), learn its layout and note
        every row's counter, so a KCL worker renewing them is seen at the next read.

        Raises:
            LeaseStoreError: the table is missing or not a KCL lease table (naming it).
        """
        if self.ready:
            return
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            table = self.dynamo.client_now().describe_table(TableName=self.table)["Table"]
        except (ClientError, BotoCoreError) as e:
            error = self.dynamo.translate(e, "DescribeTable")
            if error.aws_code == "ResourceNotFoundException":
                raise LeaseStoreError(f"KCL lease table {self.table!r} does not exist (KclLeaseStore never "
                                      "creates it: name the KCL application's table)",
                                      aws_code="ResourceNotFoundException") from e
            raise error from e
        keys = [(k.get("AttributeName"), k.get("KeyType")) for k in table.get("KeySchema", [])]
        if keys != [(K_KEY, "HASH")]:
            raise LeaseStoreError(f"table {self.table!r} is not a KCL lease table: its key is {keys}, "
                                  f"KCL's is [({K_KEY!r}, 'HASH')]")
        self.ready = True
        items = self._scan_items()
        if self.multi is None:
            self.multi = any(isinstance(item.get(K_STREAM_NAME), str) for item in items)
            logger.info("KCL lease table %s: %s-stream, %d lease rows", self.table,
                        "multi" if self.multi else "single", len(items))
        for item in items:
            self._observe(item)

    def _split(self, key: str) -> tuple[str, str]:
        stream, _, shard_id = key.partition(":")
        self.check_stream(stream)
        return stream, shard_id

    def _identifier(self, stream: str, identity: tuple[str, int] | None = None) -> str | None:
        if not self.multi:
            return None
        known = self._stream_ids.get(stream)
        if known is None and identity is not None:
            known = multi_stream_identifier(stream, identity)
        if known is None:
            self.scan(stream)
            known = self._stream_ids.get(stream)
        return known

    def _kcl_key(self, stream: str, shard_id: str) -> str | None:
        if not self.multi:
            return shard_id
        identifier = self._identifier(stream)
        return None if identifier is None else f"{identifier}:{shard_id}"

    def _to_row(self, item: Mapping[str, Any], stream: str, shard_id: str) -> Row:
        return item_to_row(item, stream, shard_id, self._durations.get(lease_key(stream, shard_id), self.duration_ms))

    def _observe(self, item: Mapping[str, Any]) -> None:
        """Note a row's counter and our token; a counter raised by a writer that is not ours
        (no new token of ours) is a live KCL worker."""
        key, counter, token = str(item[K_KEY]), int(item[K_COUNTER]), item.get(A_TOKEN)
        seen = self._writes.get(key)
        self._writes[key] = (counter, token)
        if seen is not None and counter > seen[0] and token == seen[1] and self.live is None:
            owner = item.get("checkpointOwner") or item.get("leaseOwner")
            self.live = (f"KCL lease table {self.table!r}: lease {key!r} was renewed by {owner!r} (leaseCounter "
                         f"{seen[0]} -> {counter}) and not by kinesis_actors: a KCL worker is running on this "
                         "table. Stop the KCL fleet (every worker) before starting kinesis_actors on it; a live mix "
                         "of both fleets on one table is not supported")
        if self.live is not None:
            raise KclFleetLiveError(self.live)

    def _scan_items(self) -> list[dict[str, Any]]:
        return [item for item in self.dynamo.scan_items() if is_lease_item(item)]

    def scan(self, stream: str) -> list[Row]:
        """Every lease row of ``stream`` (a multi-stream table: of one incarnation, the known one,
        else the newest creation epoch), as our rows."""
        self.ensure_table()
        self.check_stream(stream)
        rows: list[Row] = []
        multi: dict[str, list[dict[str, Any]]] = {}
        for item in self._scan_items():
            if not self.multi:
                self._observe(item)
                rows.append(self._to_row(item, stream, str(item[K_KEY])))
                continue
            identifier = item.get(K_STREAM_NAME)
            if isinstance(identifier, str) and stream_of_identifier(identifier) == stream \
                    and isinstance(item.get(K_SHARD_ID), str):
                multi.setdefault(identifier, []).append(item)
        if multi:
            identifier = self._stream_ids.get(stream)
            if identifier not in multi:
                identifier = max(multi, key=lambda i: int(i.rsplit(":", 1)[1]))
                self._stream_ids[stream] = identifier
            for item in multi[identifier]:
                self._observe(item)
                rows.append(self._to_row(item, stream, item[K_SHARD_ID]))
        return rows

    def read(self, key: str) -> Row | None:
        """The KCL row of our key ``"<stream>:<shard id>"``, as our row, or None."""
        self.ensure_table()
        if self.live is not None:
            raise KclFleetLiveError(self.live)
        stream, shard_id = self._split(key)
        kcl_key = self._kcl_key(stream, shard_id)
        if kcl_key is None:
            return None
        response = self.dynamo.api("GetItem", TableName=self.table, Key={K_KEY: {"S": kcl_key}}, ConsistentRead=True)
        item = from_item(response["Item"]) if response.get("Item") else None
        if item is None or not is_lease_item(item):
            return None
        self._observe(item)
        return self._to_row(item, stream, shard_id)

    def put_new(self, row: Row) -> bool:
        """Create the KCL item of a new lease (``PutItem`` on ``attribute_not_exists(leaseKey)``).
        KCL rows record no expiry: ``row``'s ``lease_expiry`` is removed (the caller's Lease is
        built from ``row``).

        Raises:
            InvalidError: a multi-stream table without a row of the stream and no stream identity.
        """
        self.ensure_table()
        stream, shard_id = row[STREAM], row[SHARD_ID]
        self.check_stream(stream)
        identity = None
        if row.get(STREAM_ARN) is not None and row.get(STREAM_CREATION_MS) is not None:
            identity = (row[STREAM_ARN], int(row[STREAM_CREATION_MS]))
        identifier = self._identifier(stream, identity)
        if self.multi and identifier is None:
            raise InvalidError(f"KCL lease table {self.table!r} is multi-stream and has no row of stream "
                               f"{stream!r}: a new lease needs the stream's ARN and creation time")
        kcl_key = shard_id if identifier is None else f"{identifier}:{shard_id}"
        if identifier is not None:
            self._stream_ids.setdefault(stream, identifier)
        row.pop(EXPIRY, None)
        response = self.dynamo.api("PutItem", conditional=True, TableName=self.table,
                                   Item=to_item(new_item(row, kcl_key, identifier)),
                                   ConditionExpression="attribute_not_exists(#key)",
                                   ExpressionAttributeNames={"#key": K_KEY})
        if response is not None:
            self._writes[kcl_key] = (int(row[COUNTER]), None)
            self._durations[row[KEY]] = self.duration_ms = int(row[DURATION_MS])
        return response is not None

    def update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
               remove_fields: Iterable[str] = (), check_owner: bool = True) -> Row | None:
        """The ``UpdateItem`` KCL itself makes for this change (``kcl_update``), as our row, or None."""
        self.ensure_table()
        stream, shard_id = self._split(key)
        kcl_key = self._kcl_key(stream, shard_id)
        if kcl_key is None:
            return None
        update = kcl_update(expect_owner, expect_counter, set_fields, remove_fields, check_owner=check_owner,
                            to_attr=to_attr)
        response = self.dynamo.api("UpdateItem", conditional=True, TableName=self.table, Key={K_KEY: {"S": kcl_key}},
                                   UpdateExpression=update.expression, ConditionExpression=update.condition,
                                   ExpressionAttributeNames=update.names, ExpressionAttributeValues=update.values,
                                   ReturnValues="ALL_NEW")
        if response is None:
            return None
        item = from_item(response["Attributes"])
        self._writes[kcl_key] = (int(item[K_COUNTER]), item.get(A_TOKEN))
        if DURATION_MS in set_fields:
            self._durations[key] = self.duration_ms = int(set_fields[DURATION_MS])
        return self._to_row(item, stream, shard_id)

    def delete(self, key: str) -> None:
        """Never called (no presence rows): raises InvalidError, nothing is deleted from a KCL table."""
        raise InvalidError(f"KclLeaseStore never deletes rows of KCL lease table {self.table!r} ({key!r})")
