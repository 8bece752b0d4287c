"""Stop.merge: a consumer's one stop reason, whatever order the requests come in."""

from __future__ import annotations

from kinesis_actors.reader import ConsumerState, Stop, StopReason
from kinesis_actors.reader.states import BEHAVIOURS

R, H, L = StopReason.REQUESTED, StopReason.HANDOFF, StopReason.LEASE_LOST


def test_a_lost_lease_beats_every_other_reason() -> None:
    for first in (Stop(R), Stop(R, release=False), Stop(H, to="b"), Stop(StopReason.FAILED)):
        assert first.merge(Stop(L)).reason is L
        assert Stop(L).merge(first).reason is L


def test_keeping_the_lease_beats_a_handoff_and_a_handoff_beats_a_release() -> None:
    keep, release, handoff = Stop(R, release=False), Stop(R), Stop(H, to="b")
    assert keep.merge(handoff) is keep and handoff.merge(keep) == keep
    assert release.merge(handoff) is handoff and handoff.merge(release) is handoff
    assert handoff.merge(Stop(H, to="c")).to == "b", "the first asker stays"


def test_shutting_down_ends_in_the_terminal_state_of_each_reason() -> None:
    assert dict(BEHAVIOURS[ConsumerState.SHUTTING_DOWN].next) == {
        R: ConsumerState.CLOSED, H: ConsumerState.HANDED_OVER, StopReason.SHARD_END: ConsumerState.SHARD_ENDED,
        StopReason.FAILED: ConsumerState.FAILED, L: ConsumerState.LOST}
