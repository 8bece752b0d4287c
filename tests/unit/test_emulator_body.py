"""The emulator's own GetRecords body (kinesis_actors.emulator.get_records_body): the JSON text
for documents msgspec refuses, and moto's unix timestamps (moto imported, no server, no Ray)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from kinesis_actors.emulator.get_records_body import encode_body, unix_timestamp


def test_a_partition_key_with_a_lone_surrogate_is_written_as_json_escapes_it() -> None:
    doc = {"Records": [{"PartitionKey": "\ud800", "Data": "AA=="}, {"PartitionKey": "h\u00e9", "Data": ""}]}
    body = encode_body(doc)
    assert json.loads(body) == doc
    assert json.loads(encode_body({"Records": [{"PartitionKey": "h\u00e9"}]})) == {"Records": [{"PartitionKey": "h\u00e9"}]}


@pytest.mark.parametrize("value", [
    dt.datetime(2026, 1, 1, 0, 0, 0, 123456), dt.datetime(2026, 1, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
    dt.datetime(2026, 1, 1, 0, 0, 0, 999), dt.datetime(2026, 1, 1, 5, 0, 0, 1000,
                                                        tzinfo=dt.timezone(dt.timedelta(hours=5, seconds=1))),
])
def test_unix_timestamp_is_what_moto_s_serializer_writes(value: dt.datetime) -> None:
    from moto.core.serialize import TimestampSerializer

    unix = TimestampSerializer.TIMESTAMP_FORMAT_UNIX
    stock = TimestampSerializer(unix)._convert_timestamp_to_str(value, unix)
    ours = unix_timestamp(value)
    assert ours == stock and type(ours) is type(stock)
