"""cluster/prometheus/alerts.yaml and cluster/grafana/: valid, and every metric they query is one the
library exports, with the labels it carries, compared against the registry in kinesis_actors.metrics;
the docs' metrics table (docs/metrics.md) lists that registry, no more, no less (offline, no Ray)."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

from kinesis_actors import metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
RULES = REPO / "cluster" / "prometheus" / "alerts.yaml"
DASHBOARD = REPO / "cluster" / "grafana" / "kinesis_actors_dashboard.json"
RAY_PREFIX = "ray_"  # Ray's Prometheus export prefixes application metrics; counters get "_total"
RAY_LABELS = {"SessionName", "instance", "job", "NodeAddress", "Version", "Component", "WorkerId"}
METRIC_RE = re.compile(r"\b" + RAY_PREFIX + metrics.PREFIX + r"\w+")
GROUPING_RE = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
MATCHER_RE = re.compile(r"\{([^}]*)\}")


def exported() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Prometheus name -> (kind, labels) of every metric the registry defines, as Ray exports it."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for names, kind, tags in ((metrics.SHARD_COUNTERS, "counter", metrics.SHARD_TAGS),
                              (metrics.INSTANCE_COUNTERS, "counter", metrics.INSTANCE_TAGS),
                              (metrics.SHARD_GAUGES, "gauge", metrics.SHARD_TAGS),
                              (metrics.INSTANCE_GAUGES, "gauge", metrics.INSTANCE_TAGS),
                              (metrics.READER_GAUGES, "gauge", metrics.READER_TAGS)):
        for name in names:
            prom = RAY_PREFIX + metrics.PREFIX + name + ("_total" if kind == "counter" else "")
            out[prom] = (kind, tuple(tags))
    return out


def rule_expressions() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def check_expression(expr: str) -> list[str]:
    """Problems of one PromQL expression: unknown metrics, labels no queried metric carries."""
    known = exported()
    used = set(METRIC_RE.findall(expr))
    problems = [f"{m} is not exported (registry: {sorted(known)})" for m in used if m not in known]
    labels = {lab for m in used if m in known for lab in known[m][1]} | RAY_LABELS
    grouped = {lab.strip() for g in GROUPING_RE.findall(expr) for lab in g.split(",") if lab.strip()}
    matched = {part.split("=")[0].strip(" !~") for g in MATCHER_RE.findall(expr) for part in g.split(",") if "=" in part}
    problems += [f"label {lab!r} is on none of {sorted(used)}" for lab in (grouped | matched) - labels]
    if not used:
        problems.append("queries no kinesis_actors metric")
    return problems


def test_every_metric_the_rules_and_the_dashboard_query_is_exported() -> None:
    exprs = rule_expressions() + dashboard_expressions()
    assert len(exprs) >= 10
    problems = {e: p for e in exprs if (p := check_expression(e))}
    assert not problems, problems


def test_the_check_catches_a_wrong_name_a_counter_without_total_and_a_missing_label() -> None:
    assert check_expression("rate(ray_kinesis_actors_records_delivered_total[1m])") == []
    assert check_expression("ray_kinesis_actors_records_deliverd_total > 0")
    assert check_expression("rate(ray_kinesis_actors_records_delivered[1m])"), "Ray exports counters as _total"
    assert check_expression("kinesis_actors_leases_held > 0"), "without Ray's prefix nothing matches"
    assert check_expression("sum by (shard_id) (ray_kinesis_actors_leases_held)"), "leases_held has no shard_id"


def test_the_alerts_cover_what_production_alerts_on() -> None:
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    queried = {name: set(METRIC_RE.findall(r["expr"])) for name, r in rules.items()}
    wanted = {"millis_behind_latest", "leases_taken_total", "leases_lost_total", "dead_letter_records_total",
              "checkpoint_age_s"}
    covered = {m.removeprefix(RAY_PREFIX + metrics.PREFIX) for ms in queried.values() for m in ms}
    assert wanted <= covered, wanted - covered
    stale = queried["KinesisCheckpointStale"]
    assert {"ray_kinesis_actors_checkpoint_age_s", "ray_kinesis_actors_millis_behind_latest"} <= stale, \
        "checkpoint age only on shards that have records"
    assert rules["KinesisMetricsAbsent"]["expr"].startswith("absent(ray_kinesis_actors_leases_held"), \
        "a lost head node loses every metric: one rule must fire on their absence"
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"], name


def test_the_rules_file_is_valid() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"}
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert isinstance(rule["alert"], str) and isinstance(rule["expr"], str)
            assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule
            assert rule["expr"].count("(") == rule["expr"].count(")"), rule["expr"]
    promtool = shutil.which("promtool")  # Debian's prometheus package (apt-get install prometheus)
    if promtool is None:
        pytest.skip("promtool not installed: the YAML structure above was checked, not PromQL")
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_dashboard_is_a_grafana_dashboard_for_rays_integration() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "SessionName"} <= names, "filters like Ray's own dashboards"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"] == "${datasource}" and panel["targets"], panel["title"]


def test_the_docs_metrics_table_lists_the_registry() -> None:
    readme = (REPO / "docs" / "metrics.md").read_text()
    rows = re.findall(r"^\| `(ray_kinesis_actors_\w+)` \| (counter|gauge) \| ([^|]+) \|", readme, re.MULTILINE)
    table = {name: (kind, tuple(lab.strip(" `") for lab in labels.split(","))) for name, kind, labels in rows}
    assert table == exported()
