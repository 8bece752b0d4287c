"""bench's tables print the digits a goal's comparison uses, and say which run a section comes from."""

from __future__ import annotations

from bench.common import fmt_against, fmt_ratio, goal_threshold, section_source
from bench.report import markdown


def figure(value: float, goal: str, met: bool, anchor_value: float | None = None) -> dict:
    ratio = None if anchor_value is None else round(value / anchor_value, 3)
    return {"section": "failover", "name": "crash_to_survivor_first_record_s", "value": value, "unit": "s",
            "anchor": "lease_duration_s + 2" if anchor_value else None, "anchor_value": anchor_value,
            "goal": goal, "goal_met": met, "ratio": ratio}


def test_a_value_just_over_its_goal_never_prints_as_the_goal() -> None:
    f = figure(12.02, "<= 12 s", False, anchor_value=12.0)
    assert goal_threshold(f) == 12.0
    assert fmt_against(12.02, 12.0) == "12.02"
    assert fmt_ratio(f) == "1.002x"
    assert "| 12.02 | s |" in markdown({"figures": [f]}) and "| 12.0 | s |" not in markdown({"figures": [f]})


def test_figures_far_from_their_goal_keep_the_short_form() -> None:
    assert fmt_against(113.7, 250.0) == "113.7"
    assert fmt_against(10.2, 12.0) == "10.2"
    assert fmt_against(11.996, 12.0) == "11.996"
    assert goal_threshold(figure(22_166.0, ">= 1.2x raw single", True, anchor_value=12_029.0)) == 1.2 * 12_029.0
    assert goal_threshold({"goal_met": None, "goal": "<= 5"}) is None


def test_a_section_names_the_run_that_measured_it() -> None:
    data = {"date": "2026-11-29", "merged_runs": [{"started_utc": "2026-12-01T11:46", "params": {"sections": ["peer"]}}]}
    assert section_source(data, "peer") == "section `peer`, measured 2026-12-01T11:46"
    assert section_source(data, "failover") == "section `failover`, measured 2026-11-29"
