"""MemoryLeaseStore's group commit (``_GroupCalls``): concurrent primitives share one actor call.

No Ray: ``send`` is a plain function standing in for ``ray.get(actor.call_many.remote(...))``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kinesis_actors.errors import LeaseStoreError
from kinesis_actors.leases.memory import MemoryLeaseTable, _GroupCalls

WAIT_S = 10.0


class GatedSend:
    """A ``send`` that records each group and blocks the first one until released."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[str, tuple[Any, ...]]]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_with: BaseException | None = None

    def __call__(self, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        self.groups.append(list(calls))
        if len(self.groups) == 1:
            self.entered.set()
            assert self.release.wait(WAIT_S)
        if self.fail_with is not None:
            raise self.fail_with
        return [f"{op}:{args[0]}" if op != "bad" else ValueError("bad op") for op, args in calls]


def _in_thread(group: _GroupCalls, send: GatedSend, call: tuple[str, tuple[Any, ...]],
               out: dict[str, Any]) -> threading.Thread:
    def work() -> None:
        try:
            out[call[1][0]] = group.run(call, send)
        except BaseException as e:
            out[call[1][0]] = e

    t = threading.Thread(target=work)
    t.start()
    return t


def _wait_queued(group: _GroupCalls, n: int) -> None:
    for _ in range(1000):
        with group._lock:
            if len(group._queue) >= n:
                return
        threading.Event().wait(0.01)
    raise AssertionError(f"{n} calls never queued")


def test_a_lone_call_goes_out_alone_at_once() -> None:
    group, send = _GroupCalls(), GatedSend()
    send.release.set()
    assert group.run(("read", ("a",)), send) == "read:a"
    assert send.groups == [[("read", ("a",))]] and (group.groups, group.calls) == (1, 1)


def test_calls_arriving_while_a_group_is_in_flight_go_out_together_and_each_gets_its_own_answer() -> None:
    group, send = _GroupCalls(), GatedSend()
    out: dict[str, Any] = {}
    first = _in_thread(group, send, ("update", ("k0",)), out)
    assert send.entered.wait(WAIT_S)
    later = [_in_thread(group, send, ("update", (f"k{i}",)), out) for i in range(1, 6)]
    _wait_queued(group, 5)
    send.release.set()
    for t in [first, *later]:
        t.join(WAIT_S)
    assert out == {f"k{i}": f"update:k{i}" for i in range(6)}
    assert [len(g) for g in send.groups] == [1, 5]
    assert (group.groups, group.calls) == (2, 6)
    assert not group._busy and not group._queue


def test_a_failed_group_fails_every_call_in_it_and_the_next_group_still_goes_out() -> None:
    group, send = _GroupCalls(), GatedSend()
    send.fail_with = LeaseStoreError("table actor gone", retriable=True)
    out: dict[str, Any] = {}
    first = _in_thread(group, send, ("update", ("k0",)), out)
    assert send.entered.wait(WAIT_S)
    second = _in_thread(group, send, ("read", ("k1",)), out)
    _wait_queued(group, 1)
    send.release.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert isinstance(out["k0"], LeaseStoreError) and isinstance(out["k1"], LeaseStoreError)
    assert len(send.groups) == 2
    send.fail_with = None
    assert group.run(("read", ("k2",)), send) == "read:k2"


def test_one_bad_primitive_fails_only_its_caller() -> None:
    group, send = _GroupCalls(), GatedSend()
    out: dict[str, Any] = {}
    first = _in_thread(group, send, ("read", ("k0",)), out)
    assert send.entered.wait(WAIT_S)
    bad = _in_thread(group, send, ("bad", ("k1",)), out)
    good = _in_thread(group, send, ("read", ("k2",)), out)
    _wait_queued(group, 2)
    send.release.set()
    for t in (first, bad, good):
        t.join(WAIT_S)
    assert out["k0"] == "read:k0" and out["k2"] == "read:k2" and isinstance(out["k1"], ValueError)


def test_the_table_runs_a_group_in_order_and_reports_a_bad_operation_in_place() -> None:
    table = MemoryLeaseTable()
    row = {"lease_key": "s:a", "stream": "s", "lease_counter": 0, "lease_owner": "me"}
    results = table.call_many([("put_new", (row,)), ("update", ("s:a", "me", 0, {"lease_counter": 1})),
                               ("nope", ()), ("read", ("s:a",))])
    assert results[0] is True and results[1]["lease_counter"] == 1
    assert isinstance(results[2], ValueError) and results[3]["lease_counter"] == 1
    with pytest.raises(ValueError):
        table.call("nope")


def test_renewals_fall_due_on_a_grid_late_by_less_than_one_slot() -> None:
    from kinesis_actors.reader.lease import RENEW_SLOT_S, renewal_slot

    for due in (100.0, 100.01, 100.2, 100.25, 101.7):
        slot = renewal_slot(due, 3.0)
        assert due <= slot < due + RENEW_SLOT_S + 1e-9
        assert abs(slot / RENEW_SLOT_S - round(slot / RENEW_SLOT_S)) < 1e-9
    assert renewal_slot(100.01, 3.0) == renewal_slot(100.2, 3.0), "renewals due close together share a slot"
    assert renewal_slot(5.01, 0.5) <= 5.01 + 0.05 + 1e-9, "a short renew interval gets a finer grid"
