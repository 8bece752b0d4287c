"""cluster/ manifests validated offline: the RayJob against KubeRay's CRD schema (strictly: an
unknown field fails, as ``kubectl --validate=strict`` would), the ``ray up`` config against the
schema the ray package ships, the IAM policy's actions; the pipeline's flags and env."""

from __future__ import annotations

import copy
import functools
import json
import pathlib
import sys
from typing import Any

import jsonschema
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster"
# KubeRay's RayJob CRD schema (v1), vendored without its descriptions; the project's ../shared holds the full CRD
RAYJOB_SCHEMA = pathlib.Path(__file__).resolve().parent / "kuberay_rayjob_v1.schema.json"
KUBERAY_SCHEMAS = REPO.parent / "shared" / "schemas" / "kuberay"

KINESIS_ACTIONS = {"kinesis:DescribeStreamSummary", "kinesis:ListShards", "kinesis:GetShardIterator",
                   "kinesis:GetRecords", "kinesis:PutRecord", "kinesis:PutRecords"}
DYNAMODB_ACTIONS = {"dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                    "dynamodb:DeleteItem", "dynamodb:Scan"}


def strict(schema: Any) -> Any:
    """An OpenAPI v3 CRD schema where objects with declared properties refuse other keys
    (the API server prunes or rejects them; a typo must fail here, not silently vanish)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def _without_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_descriptions(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [_without_descriptions(v) for v in schema]
    return schema


@functools.cache
def rayjob_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(RAYJOB_SCHEMA.read_text())["openAPIV3Schema"]
    return jsonschema.Draft7Validator(strict(schema))


def test_the_vendored_schema_is_kuberays() -> None:
    crd_file = KUBERAY_SCHEMAS / "ray.io_rayjobs.yaml"
    if not crd_file.exists():
        pytest.skip(f"no full KubeRay CRD at {crd_file} to compare the vendored schema with")
    crd = yaml.load(crd_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 1.4 MB of YAML
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    vendored = json.loads(RAYJOB_SCHEMA.read_text())["openAPIV3Schema"]
    assert vendored == _without_descriptions(entry["schema"]["openAPIV3Schema"])


def errors(validator: jsonschema.protocols.Validator, document: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def load_rayjob() -> dict[str, Any]:
    return yaml.safe_load((CLUSTER / "kuberay" / "rayjob.yaml").read_text())


def test_the_rayjob_matches_kuberays_crd() -> None:
    job = load_rayjob()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert errors(rayjob_validator(), job) == []


def test_the_crd_check_catches_typos_and_bad_types() -> None:
    validator = rayjob_validator()
    typo = copy.deepcopy(load_rayjob())
    typo["spec"]["shutdownAfterJobFinish"] = True  # missing "es"
    assert any("shutdownAfterJobFinish" in e for e in errors(validator, typo))
    bad = copy.deepcopy(load_rayjob())
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    assert errors(validator, bad)
    missing = copy.deepcopy(load_rayjob())
    del missing["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert errors(validator, missing)


def test_the_rayjob_runs_the_pipeline_with_irsa_and_no_keys() -> None:
    job = load_rayjob()
    spec = job["spec"]
    assert "pipeline.py" in spec["entrypoint"]
    env = yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]
    assert {"KA_STREAM", "KA_LEASE_TABLE", "KA_SINK"} <= set(env) and int(env["RAY_JOB_STOP_WAIT_TIME_S"]) > 3
    cluster = spec["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    assert {t["spec"]["serviceAccountName"] for t in templates} == {"kinesis-actors"}
    account = yaml.safe_load((CLUSTER / "kuberay" / "serviceaccount.yaml").read_text())
    assert account["kind"] == "ServiceAccount" and account["metadata"]["name"] == "kinesis-actors"
    assert account["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert_no_keys(CLUSTER)


def assert_no_keys(directory: pathlib.Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file() and path.suffix in {".yaml", ".yml", ".json", ".py", ".md", ""}:
            text = path.read_text(errors="replace")
            for marker in ("AKIA", "aws_secret_access_key", "AWS_SECRET_ACCESS_KEY=", "aws_access_key_id="):
                assert marker not in text, f"{path} looks like it holds a key ({marker})"


def test_the_ray_up_config_matches_the_schema_ray_ships() -> None:
    import ray

    schema_path = pathlib.Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    schema = json.loads(schema_path.read_text())
    config = yaml.safe_load((CLUSTER / "aws" / "cluster.yaml").read_text())
    assert errors(jsonschema.Draft7Validator(schema), config) == []
    assert config["provider"]["type"] == "aws"
    for node_type in config["available_node_types"].values():
        assert node_type["node_config"]["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::")
    typo = copy.deepcopy(config)
    typo["max_worker"] = 3
    assert errors(jsonschema.Draft7Validator(schema), typo)


def test_the_ray_up_config_passes_rays_own_check() -> None:
    """What ``ray up`` does before any AWS call: merge the provider's defaults, then validate."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((CLUSTER / "aws" / "cluster.yaml").read_text()))
    validate_config(config)
    assert set(config["available_node_types"]) == {"ray.head.default", "ray.worker.readers"}


def test_the_iam_policy_is_least_privilege() -> None:
    policy = json.loads((CLUSTER / "iam" / "kinesis-actors-policy.json").read_text())
    assert policy["Version"] == "2012-10-17"
    actions: set[str] = set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        assert "NotAction" not in statement and "NotResource" not in statement
        stmt_actions = {statement["Action"]} if isinstance(statement["Action"], str) else set(statement["Action"])
        resources = [statement["Resource"]] if isinstance(statement["Resource"], str) else statement["Resource"]
        assert all("*" not in a for a in stmt_actions), "no wildcard actions"
        assert all("*" not in r for r in resources), "no wildcard resources"
        services = {a.split(":")[0] for a in stmt_actions}
        assert len(services) == 1
        if services == {"kinesis"}:
            assert all(r.startswith("arn:aws:kinesis:") and ":stream/" in r for r in resources)
        else:
            assert services == {"dynamodb"}
            assert all(r.startswith("arn:aws:dynamodb:") and ":table/" in r for r in resources)
        actions |= stmt_actions
    assert actions == KINESIS_ACTIONS | DYNAMODB_ACTIONS


def test_the_pipeline_reads_flags_over_environment() -> None:
    sys.path.insert(0, str(CLUSTER))
    try:
        import pipeline
    finally:
        sys.path.remove(str(CLUSTER))
    env = {"KA_STREAM": "orders", "KA_LEASE_TABLE": "orders-leases", "KA_SINK": "parquet:/tmp/x",
           "KA_WINDOW_S": "2.5", "KA_TEST_CREDENTIALS": "1"}
    cfg = pipeline.parse_args([], env)
    assert (cfg.stream, cfg.lease_table, cfg.sink, cfg.window_s, cfg.test_credentials) == (
        "orders", "orders-leases", "parquet:/tmp/x", 2.5, True)
    cfg = pipeline.parse_args(["--stream", "other", "--window-s", "1"], env)
    assert (cfg.stream, cfg.window_s) == ("other", 1.0)
    with pytest.raises(SystemExit):
        pipeline.parse_args([], {})  # no stream, no table
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--sink", "csv:/x"], env)
    assert pipeline.start_position("trim_horizon").kind == "TRIM_HORIZON"
    assert pipeline.start_position("2024-01-01T00:00:00").timestamp_ms == 1704067200000
