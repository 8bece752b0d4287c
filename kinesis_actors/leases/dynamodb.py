""":class:`DynamoLeaseStore`: the lease table in Amazon DynamoDB (KCL style), shared by instances.

The lease rules are :class:`~kinesis_actors.leases.rules.LeaseRules`'s; :class:`DynamoRows`
maps the table interface (:class:`~kinesis_actors.leases.rows.LeaseTable`) onto DynamoDB:

- read: ``GetItem`` with ``ConsistentRead=True``;
- scan: ``Scan`` with ``ConsistentRead=True``, a ``FilterExpression`` on the ``stream``
  attribute and the ``"<stream>:"`` (shard rows) or ``"<stream>#instance#"`` (presence
  rows) key prefix, paged through ``LastEvaluatedKey``;
- create: ``PutItem`` with ``ConditionExpression=attribute_not_exists(lease_key)``;
- update: ``UpdateItem`` with a ``ConditionExpression`` on ``lease_counter`` and
  ``lease_owner`` (``attribute_not_exists(lease_owner)`` for a free row) and
  ``ReturnValues=ALL_NEW``; ``ConditionalCheckFailedException`` is the failed condition;
- delete (presence rows only): ``DeleteItem``.

The table's check and creation on first use, and the settings' checks, are
:mod:`~kinesis_actors.leases.dynamo_table`'s. ``checkpoint`` is stored as S: Kinesis sequence
numbers have 56 digits, more than a DynamoDB number holds.

Retries live in one layer. The client is built with botocore's retries off
(``max_attempts=0``): the holder's writes (renewals, checkpoints, the first start position,
``SHARD_END``) are retried by the reader's lease keeper until the lease's own deadline, the
Coordinator's first table read until its first pass's deadline, and its later reads and takes
run again at its next lease poll. botocore's retries under those would stack (three attempts, each up
to the read timeout, inside one attempt of ours), and a renewal could then outlive the
deadline it is retried against.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ..aws import AwsSettings
from ..clock import Clock, WallClock, monotonic_s, wall_s
from ..errors import InvalidError, KinesisError, LeaseStoreError, aws_error_code, translate_aws_error
from .dynamo_table import check_or_create_table, check_settings, frozen_session_settings
from .rows import COUNTER, KEY, OWNER, STREAM, Row
from .rules import LeaseRules

__all__ = ["DynamoLeaseStore", "DynamoRows", "check_settings"]

logger = logging.getLogger(__name__)

_CLIENT_LOCK = threading.Lock()  # boto3 sessions are not thread-safe when building clients


def to_attr(value: Any) -> dict[str, Any]:
    """Python value -> DynamoDB AttributeValue (str: S, int and finite float: N, tuple/list/set of str: SS)."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, float) and math.isfinite(value):
        return {"N": repr(value)}
    if isinstance(value, (tuple, list, set, frozenset)):
        return {"SS": sorted(str(v) for v in value)}
    raise TypeError(f"cannot store {type(value).__name__} in the lease table")


def from_attr(attr: Mapping[str, Any]) -> Any:
    """DynamoDB AttributeValue -> Python value (N: int when integral)."""
    (kind, value), = attr.items()
    if kind == "S":
        return value
    if kind == "N":
        try:
            return int(value)
        except ValueError:
            return float(value)
    if kind == "SS":
        return tuple(sorted(value))
    if kind == "L":
        return tuple(from_attr(v) for v in value)
    if kind == "BOOL":
        return bool(value)
    if kind == "NULL":
        return None
    return value


def to_item(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: to_attr(value) for name, value in row.items() if value is not None and value != ()}


def from_item(item: Mapping[str, Any]) -> Row:
    return {name: from_attr(attr) for name, attr in item.items()}


class DynamoRows:
    """A DynamoDB table as a :class:`~kinesis_actors.leases.rows.LeaseTable`, and the one
    client of it (settings, lazy client, error translation) that ``KclRows`` reuses.

    Picklable: the boto3 client is rebuilt lazily in each process; a ``boto3.Session`` is
    frozen into its credentials and region when pickled.

    Args:
        table: table name. create_if_missing: create the table on first use if missing.
        endpoint / region / test_credentials / session: see :class:`DynamoLeaseStore`.
        scan_page_size: ``Limit`` of each ``Scan`` page, or None.
    """

    presence = True

    def __init__(self, table: str, *, create_if_missing: bool = False, endpoint: str | None = None,
                 region: str | None = None, test_credentials: bool | None = None, session: Any = None,
                 scan_page_size: int | None = None) -> None:
        self.table = table
        self.create_if_missing = create_if_missing
        self._endpoint = endpoint
        self._region = region
        self._test_credentials = test_credentials
        self._session = session
        self._frozen_session: tuple[Any, str | None] | None = None
        self._inherited: AwsSettings | None = None
        self.faults: Any = None  # a test fault injector (kinesis_actors.testing.with_faults)
        self._scan_page_size = scan_page_size
        self._init_client()

    def _init_client(self) -> None:
        self.client: Any = None  # built on first use
        self._client_lock = threading.Lock()
        self.ready = False  # the table was checked (and created) in this process

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("client", "_client_lock", "ready")}
        session = state.pop("_session", None)
        if session is not None:  # a boto3 Session cannot be pickled: freeze what it holds
            state["_frozen_session"] = frozen_session_settings(session)
        state["_session"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_client()

    def peer(self) -> DynamoRows:
        """This table: boto3 clients are thread-safe, and it keeps nothing per store."""
        return self

    def bound(self, aws: AwsSettings) -> DynamoRows:
        """A copy whose unset settings come from ``aws`` (a new client; no I/O)."""
        other = object.__new__(DynamoRows)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("client", "_client_lock", "ready")})
        other._init_client()
        other._inherited = aws
        return other

    @property
    def endpoint(self) -> str | None:
        """The endpoint URL in effect (explicit, else inherited), or None."""
        return self._endpoint if self._endpoint is not None else (self._inherited.endpoint if self._inherited else None)

    def settings(self) -> AwsSettings:
        """The AWS settings in effect: explicit values, then the inherited ones (see :class:`DynamoLeaseStore`)."""
        own = AwsSettings(endpoint=self._endpoint, region=self._region, test_credentials=bool(self._test_credentials))
        frozen = frozen_session_settings(self._session) if self._session is not None else self._frozen_session
        if frozen is not None:
            credentials, session_region = frozen
            own = dataclasses.replace(own, test_credentials=False, credentials=credentials,
                                      region=own.region or session_region)
        merged = own if self._inherited is None else own.merged_over(self._inherited)
        if self._inherited is not None and (self._test_credentials is False or frozen is not None):
            merged = dataclasses.replace(merged, test_credentials=False)
        if self.faults is not None:
            merged = dataclasses.replace(merged, faults=self.faults)
        return merged

    def client_now(self) -> Any:
        """The boto3 DynamoDB client of this process (built on first use, botocore retries off)."""
        if self.client is None:
            settings = self.settings()
            with _CLIENT_LOCK:
                if self.client is None:
                    self.client = settings.client("dynamodb", max_attempts=0)
        return self.client

    def translate(self, exc: BaseException, operation: str) -> KinesisError:
        """Every botocore error of this table goes through here (then ``raise ... from exc``)."""
        translated = translate_aws_error(exc, operation=operation, resource=self.table)
        code = translated.aws_code or aws_error_code(exc)
        if code == "ResourceNotFoundException":
            self.ready = False
            return LeaseStoreError(f"lease table {self.table!r} does not exist ({operation})", aws_code=code)
        if isinstance(translated, (InvalidError, LeaseStoreError)):
            return translated
        return LeaseStoreError(f"lease table {self.table!r}: {translated}", aws_code=code,
                               retriable=translated.retriable)

    def api(self, operation: str, *, conditional: bool = False, **kwargs: Any) -> Any:
        """Call one DynamoDB API (one attempt); None when ``conditional`` and the condition failed.

        Raises:
            LeaseStoreError / InvalidError: any other error, translated (:meth:`translate`).
        """
        from botocore import xform_name  # "UpdateItem" -> "update_item", cached by botocore
        from botocore.exceptions import BotoCoreError, ClientError

        method = getattr(self.client_now(), xform_name(operation))
        try:
            return method(**kwargs)
        except (ClientError, BotoCoreError) as e:
            if conditional and aws_error_code(e) == "ConditionalCheckFailedException":
                return None
            raise self.translate(e, operation) from e

    def scan_items(self, **kwargs: Any) -> list[Row]:
        """Every item of a consistent ``Scan`` of the table with ``kwargs`` (a filter, a
        ``Limit``), paged through ``LastEvaluatedKey``, as rows. Raises as :meth:`api`."""
        kwargs = {"TableName": self.table, "ConsistentRead": True, **kwargs}
        rows: list[Row] = []
        while True:
            response = self.api("Scan", **kwargs)
            rows.extend(from_item(item) for item in response.get("Items", ()))
            if not response.get("LastEvaluatedKey"):
                return rows
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def ensure_table(self) -> None:
        """Check the table once per process; create it (``create_if_missing``) and wait until ACTIVE.

        Raises:
            LeaseStoreError: missing without ``create_if_missing``, or not ACTIVE in time.
        """
        if self.ready:
            return
        with self._client_lock:
            if not self.ready:
                check_or_create_table(self.client_now(), self.table, create_if_missing=self.create_if_missing,
                                      translate=self.translate)
                self.ready = True

    # ------------------------------------------------------------------ the table interface
    def read(self, key: str) -> Row | None:
        """``GetItem`` with ``ConsistentRead``."""
        self.ensure_table()
        item = self.api("GetItem", TableName=self.table, Key={KEY: {"S": key}}, ConsistentRead=True).get("Item")
        return from_item(item) if item else None

    def scan(self, stream: str) -> list[Row]:
        """Consistent ``Scan`` pages filtered on the stream and its key prefixes."""
        self.ensure_table()
        kwargs: dict[str, Any] = {
            "FilterExpression": "#stream = :stream AND (begins_with(#key, :prefix) OR begins_with(#key, :presence))",
            "ExpressionAttributeNames": {"#stream": STREAM, "#key": KEY},
            "ExpressionAttributeValues": {":stream": {"S": stream}, ":prefix": {"S": f"{stream}:"},
                                          ":presence": {"S": f"{stream}#instance#"}},
        }
        if self._scan_page_size is not None:
            kwargs["Limit"] = self._scan_page_size
        return self.scan_items(**kwargs)

    def put_new(self, row: Row) -> bool:
        """``PutItem`` on ``attribute_not_exists(lease_key)``."""
        self.ensure_table()
        return self.api("PutItem", conditional=True, TableName=self.table, Item=to_item(row),
                        ConditionExpression="attribute_not_exists(#key)",
                        ExpressionAttributeNames={"#key": KEY}) is not None

    def delete(self, key: str) -> None:
        """``DeleteItem`` (presence rows)."""
        self.ensure_table()
        self.api("DeleteItem", TableName=self.table, Key={KEY: {"S": key}})

    def update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
               remove_fields: Iterable[str] = (), check_owner: bool = True) -> Row | None:
        """``UpdateItem`` conditioned on the counter (and owner), ``ReturnValues=ALL_NEW``."""
        self.ensure_table()
        names: dict[str, str] = {"#key": KEY, "#counter": COUNTER}
        values: dict[str, Any] = {":expect_counter": {"N": str(int(expect_counter))}}
        condition = "attribute_exists(#key) AND #counter = :expect_counter"
        if check_owner:
            names["#owner"] = OWNER
            if expect_owner is None:
                condition += " AND attribute_not_exists(#owner)"
            else:
                condition += " AND #owner = :expect_owner"
                values[":expect_owner"] = {"S": expect_owner}
        sets, removes = [], []
        for i, (name, value) in enumerate(set_fields.items()):
            names[f"#s{i}"], values[f":s{i}"] = name, to_attr(value)
            sets.append(f"#s{i} = :s{i}")
        for i, name in enumerate(remove_fields):
            names[f"#r{i}"] = name
            removes.append(f"#r{i}")
        expression = " ".join(part for part in ("SET " + ", ".join(sets) if sets else "",
                                                "REMOVE " + ", ".join(removes) if removes else "") if part)
        response = self.api("UpdateItem", conditional=True, TableName=self.table, Key={KEY: {"S": key}},
                            UpdateExpression=expression, ConditionExpression=condition,
                            ExpressionAttributeNames=names, ExpressionAttributeValues=values, ReturnValues="ALL_NEW")
        return None if response is None else from_item(response["Attributes"])


class DynamoLeaseStore(LeaseRules):
    """The lease table in DynamoDB: :class:`LeaseRules` over :class:`DynamoRows`; strongly
    consistent reads, conditional writes.

    The constructor does no I/O. On first use the table is described and, with
    ``create_if_missing``, created (``PAY_PER_REQUEST``; several instances creating it at
    once all succeed) and waited for until ACTIVE. Settings left as None are inherited
    from the broker the store is given to (:meth:`bind`); explicit values are never
    overwritten. The store is picklable: the boto3 client is rebuilt lazily in each
    process, and the observation table starts empty there.

    Args:
        table: table name (3-255 characters of ``[a-zA-Z0-9_.-]``).
        create_if_missing: create the table on first use if it does not exist.
        endpoint: DynamoDB endpoint URL (an emulator), or None (inherit, else AWS).
        region: AWS region, or None (inherit, else boto3's default chain).
        test_credentials: True for fixed dummy keys (emulators); None inherits; False
            forces boto3's default credential chain.
        session: a ``boto3.Session`` whose credentials and region to use (frozen when the
            store is pickled or first used), or None.
        clock: monotonic clock, seconds (judges expiry).
        wall_clock: epoch clock, seconds (informational ``lease_expiry`` only).
        scan_page_size: ``Limit`` of each ``Scan`` page, or None for DynamoDB's 1 MB pages.

    Raises:
        InvalidError: a bad table name, endpoint or ``scan_page_size``.

    Errors of the methods: a missing table without ``create_if_missing`` ->
    ``LeaseStoreError`` naming it; throttling or network errors (one attempt: see the
    module docstring) -> ``LeaseStoreError(retriable=True)``; any other botocore error is
    translated by :func:`kinesis_actors.errors.translate_aws_error` and raised as
    ``LeaseStoreError`` (``InvalidError`` for a validation error), the cause chained.

    Example:
        >>> store = DynamoLeaseStore("app-leases", create_if_missing=True,
        ...                          endpoint="http://127.0.0.1:5000", region="us-east-1",
        ...                          test_credentials=True)
        >>> lease = store.take("orders", "shardId-000000000000", owner="a", duration_s=10.0)
        >>> lease = store.checkpoint(lease, "49590338271490256608559692538361571095921575989136588898")
        >>> store.release(lease).owner is None
        True
    """

    def __init__(self, table: str, *, create_if_missing: bool = False, endpoint: str | None = None,
                 region: str | None = None, test_credentials: bool | None = None, session: Any = None,
                 clock: Clock = monotonic_s, wall_clock: WallClock = wall_s, scan_page_size: int | None = None) -> None:
        check_settings(table, endpoint)
        if scan_page_size is not None and (
                isinstance(scan_page_size, bool) or not isinstance(scan_page_size, int) or scan_page_size < 1):
            raise InvalidError(f"scan_page_size must be a positive int or None, got {scan_page_size!r}")
        rows = DynamoRows(table, create_if_missing=bool(create_if_missing), endpoint=endpoint, region=region,
                          test_credentials=test_credentials, session=session, scan_page_size=scan_page_size)
        super().__init__(rows, clock=clock, wall_clock=wall_clock)

    @property
    def dynamo(self) -> DynamoRows:
        """The table's :class:`DynamoRows` (its settings and client)."""
        assert isinstance(self.rows, DynamoRows)
        return self.rows

    @property
    def table(self) -> str:
        """The lease table name."""
        return self.dynamo.table

    @property
    def endpoint(self) -> str | None:
        """The endpoint URL in effect (explicit, else inherited from the broker), or None."""
        return self.dynamo.endpoint

    def __repr__(self) -> str:
        return f"DynamoLeaseStore(table={self.table!r}, endpoint={self.endpoint!r})"

    def settings(self) -> AwsSettings:
        """The AWS settings in effect: explicit values, then the inherited ones. May resolve the
        credentials of an explicit ``boto3.Session`` (no network I/O for static keys)."""
        return self.dynamo.settings()

    def bind(self, aws: AwsSettings) -> DynamoLeaseStore:
        """A copy whose settings left as None are taken from the broker's ``aws`` (explicit
        endpoint, region and credentials are never overwritten); empty observation table. No I/O.

        Raises:
            InvalidError: ``aws`` is not an ``AwsSettings``.
        """
        if not isinstance(aws, AwsSettings):
            raise InvalidError(f"bind needs an AwsSettings, got {type(aws).__name__}")
        other: DynamoLeaseStore = self.peer(rows=self.dynamo.bound(aws))
        return other

    def inject_faults(self, injector: Any) -> DynamoLeaseStore:
        """Route every DynamoDB call of this store's clients, in every process, through a test
        fault injector (``kinesis_actors.testing.with_faults(..., lease_store=True)``); the
        injector travels with the pickled store. Changes this store in place; returns it."""
        self.dynamo.faults = injector
        return self
