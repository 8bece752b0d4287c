"""The delivery keywords of KinesisStream, their checks, PartialBatchError and the dead-letter document."""

from __future__ import annotations

import base64
import json
import pickle
from typing import Any

import pytest

import kinesis_actors
from kinesis_actors import InvalidError, KinesisStream, PartialBatchError
from kinesis_actors.delivery import DeliveryOptions, check_sink_mode, dead_letter_document

from .delivery_fakes import SHARD, rec

DLQ: Any = type("FakePublisher", (), {"put_many": lambda self, items: None})()


def test_defaults_keep_todays_behaviour() -> None:
    o = KinesisStream("s").delivery_options()
    assert o == DeliveryOptions()
    assert (o.max_batch_records, o.max_batch_bytes, o.batch_window_s, o.bisect_on_error, o.max_record_age_s,
            o.record_filter, o.parallelization_factor) == (None, None, 0.0, False, None, None, 1)
    assert o.batch_limit(10_000) == 10_000 and not o.gathers


def test_the_keywords_reach_the_readers_options() -> None:
    def keep(r: Any) -> bool:
        return True

    cfg = KinesisStream("s", max_batch_records=50, max_batch_bytes=1 << 20, batch_window_s=2, bisect_on_error=True,
                        max_record_age_s=3600, dead_letter=DLQ, record_filter=keep, parallelization_factor=4,
                        max_sink_retries=3)
    o = cfg.delivery_options()
    assert (o.max_batch_records, o.max_batch_bytes, o.batch_window_s, o.bisect_on_error, o.max_record_age_s,
            o.record_filter, o.parallelization_factor, o.max_sink_retries, o.dead_letter) == (
        50, 1 << 20, 2.0, True, 3600.0, keep, 4, 3, DLQ)
    assert o.batch_limit(10_000) == 50 and o.gathers


@pytest.mark.parametrize("kw, match", [
    ({"max_batch_records": 0}, "max_batch_records"),
    ({"max_batch_records": 10_001}, "max_batch_records"),
    ({"max_batch_records": True}, "max_batch_records"),
    ({"max_batch_bytes": 0}, "max_batch_bytes"),
    ({"batch_window_s": -1}, "batch_window_s"),
    ({"batch_window_s": 301}, "batch_window_s"),
    ({"batch_window_s": float("nan")}, "batch_window_s"),
    ({"bisect_on_error": 1}, "bisect_on_error"),
    ({"max_record_age_s": 0, "dead_letter": DLQ}, "max_record_age_s"),
    ({"max_record_age_s": 60}, "needs dead_letter"),
    ({"record_filter": "not callable"}, "record_filter"),
    ({"parallelization_factor": 0}, "parallelization_factor"),
    ({"parallelization_factor": 11}, "parallelization_factor"),
    ({"parallelization_factor": 2.0}, "parallelization_factor"),
    ({"max_sink_retries": -1}, "max_sink_retries"),
])
def test_bad_values_raise_invalid_error_naming_the_keyword(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidError, match=match):
        KinesisStream("s", **kw)


def test_pull_mode_refuses_bisect_and_parallelism() -> None:
    check_sink_mode(KinesisStream("s"), None)
    check_sink_mode(KinesisStream("s", bisect_on_error=True, parallelization_factor=4), object())
    with pytest.raises(InvalidError, match="bisect_on_error needs a push sink"):
        check_sink_mode(KinesisStream("s", bisect_on_error=True), None)
    with pytest.raises(InvalidError, match="parallelization_factor=2 needs a push sink"):
        check_sink_mode(KinesisStream("s", parallelization_factor=2), None)


def test_subscribe_refuses_pull_mode_controls_before_any_aws_call() -> None:
    from kinesis_actors import KinesisBroker

    broker = KinesisBroker(endpoint="http://127.0.0.1:9", region="us-east-1", test_credentials=True)
    # not connected: a call that reached AWS (or the connection check) would raise NotConnectedError instead
    with pytest.raises(InvalidError, match="bisect_on_error needs a push sink"):
        broker.subscribe(KinesisStream("s", bisect_on_error=True))
    with pytest.raises(InvalidError, match="parallelization_factor=3"):
        broker.subscribe(KinesisStream("s", parallelization_factor=3))


def test_partial_batch_error_is_exported_and_keeps_failed_from_across_pickling() -> None:
    assert "PartialBatchError" in kinesis_actors.__all__
    e = PartialBatchError("half of it", failed_from=7)
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, PartialBatchError) and back.failed_from == 7 and str(back) == "half of it"
    assert isinstance(e, kinesis_actors.KinesisError) and e.retriable
    assert PartialBatchError(failed_from=2).failed_from == 2


def test_the_dead_letter_document_has_specs_fields() -> None:
    r = rec(3, key="order-1", data=b"\x00\xffpayload", sub=2)
    doc = json.loads(dead_letter_document(r, reason="sink", error=ValueError("bad field"), attempts=6))
    assert set(doc) == {"stream", "shard_id", "sequence_number", "sub_sequence_number", "partition_key",
                        "approximate_arrival_timestamp", "data", "error", "attempts", "reason"}
    assert doc["stream"] == "s" and doc["shard_id"] == SHARD and doc["sequence_number"] == "1003"
    assert doc["sub_sequence_number"] == 2 and doc["partition_key"] == "order-1"
    assert doc["approximate_arrival_timestamp"].startswith("2023-11-14T22:13:20") and doc["attempts"] == 6
    assert base64.b64decode(doc["data"]) == b"\x00\xffpayload"
    assert doc["error"] == "ValueError: bad field" and doc["reason"] == "sink"
    aged = json.loads(dead_letter_document(rec(4, arrival=None), reason="max_record_age", error=None, attempts=3))
    assert aged["error"] is None and aged["attempts"] == 0 and aged["approximate_arrival_timestamp"] is None
    with pytest.raises(InvalidError):
        dead_letter_document(r, reason="other", error=None, attempts=0)
