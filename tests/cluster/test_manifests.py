"""cluster/ manifests validated offline: the RayJob against KubeRay's CRD schema (strictly: an
unknown field fails, as ``kubectl --validate=strict`` would), the ``ray up`` config against the
schema the ray package ships, the IAM policy's actions; the pipeline's flags and env."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import pathlib
import re
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

PACKAGE = REPO / "kinesis_actors"
# What a job such as cluster/pipeline.py runs: the library, not its tools (the emulator, the demo, the
# console commands, the test kit). Enhanced fan-out lives in the fanout modules alone (fanout.py: its
# events and fetcher; fanout_http.py: SubscribeToShard; fanout_consumer.py: the stream consumer).
NOT_ON_THE_JOB_PATH = ("emulator/", "demo/", "cli.py", "console.py", "testing.py")
FANOUT_MODULES = ("fanout.py", "fanout_http.py", "fanout_consumer.py")
# Operations in the library that the policy leaves out on purpose, each behind an explicit opt-in the
# pipeline does not make (cluster/README.md says how to add them).
OPT_IN = {
    "kinesis:CreateStream": "KinesisStream(create_if_missing=N)",
    "dynamodb:CreateTable": "DynamoLeaseStore(create_if_missing=True), --create-lease-table",
    "kinesis:DeregisterStreamConsumer": "KinesisBroker.deregister_stream_consumer, an explicit call",
}
FANOUT_STATEMENTS = ("EnhancedFanOutRegister", "EnhancedFanOutConsumer")
# Kinesis calls KMS on the caller's behalf for a stream encrypted with a customer-managed key: no
# library call names these actions, so the call collection cannot check them (test_the_kms_statement does).
KMS_STATEMENT = "KmsEncryptedStream"
KCL_STATEMENT = "KclLeaseTable"  # --kcl-application: a KCL application's own table
KCL_MODULES = ("leases/kcl.py", "leases/kcl_table.py", "leases/kcl_update.py", "leases/kcl_rows.py")


@functools.cache
def aws_operations() -> dict[str, tuple[str, str]]:
    """Every Kinesis and DynamoDB operation, by boto3 method name and by API name -> (service, API name)."""
    import botocore.session
    from botocore import xform_name

    session = botocore.session.get_session()
    ops: dict[str, tuple[str, str]] = {}
    for service in ("kinesis", "dynamodb"):
        for op in session.get_service_model(service).operation_names:
            ops[xform_name(op)] = ops[op] = (service, op)
    return ops


def operations_called(*, fanout: bool) -> dict[str, set[str]]:
    """IAM actions of the AWS operations the library's source calls on a job's path: boto3 client
    methods (``client.get_records(...)``) and operation names given to botocore as strings
    (``"SubscribeToShard"``, signed and sent by fanout_http.py) -> the modules that call them."""
    import ast

    ops = aws_operations()
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(NOT_ON_THE_JOB_PATH) or (rel in FANOUT_MODULES and not fanout):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in ops and not node.attr[0].isupper():
                name = node.attr
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value[:1].isupper():
                name = node.value if node.value in ops else None
            if name is not None:
                service, op = ops[name]
                found.setdefault(f"{service}:{op}", set()).add(rel)
    return found


def policy_actions(*, fanout: bool) -> set[str]:
    policy = json.loads((CLUSTER / "iam" / "kinesis-actors-policy.json").read_text())
    actions: set[str] = set()
    for statement in policy["Statement"]:
        if (statement.get("Sid") in FANOUT_STATEMENTS and not fanout) or statement.get("Sid") == KMS_STATEMENT:
            continue
        actions |= {statement["Action"]} if isinstance(statement["Action"], str) else set(statement["Action"])
    return actions


def policy_statement(sid: str) -> dict[str, Any]:
    policy = json.loads((CLUSTER / "iam" / "kinesis-actors-policy.json").read_text())
    return next(s for s in policy["Statement"] if s.get("Sid") == sid)


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
    # a lost head node fails the job: KubeRay retries it, and the retry takes its own rows back at once
    assert spec["backoffLimit"] >= 1 and env["KA_OWNER_ID"]
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
        # a consumer ARN ends in its creation timestamp, unknown before it is registered: ":*" there only
        assert all("*" not in re.sub(r"/consumer/[\w.-]+:\*$", "", r) for r in resources), "no wildcard resources"
        services = {a.split(":")[0] for a in stmt_actions}
        assert len(services) == 1
        if services == {"kinesis"}:
            assert all(r.startswith("arn:aws:kinesis:") and ":stream/" in r for r in resources)
        elif services == {"kms"}:
            assert all(r.startswith("arn:aws:kms:") and ":key/" in r for r in resources)
        else:
            assert services == {"dynamodb"}
            assert all(r.startswith("arn:aws:dynamodb:") and ":table/" in r for r in resources)
        actions |= stmt_actions
        if statement.get("Sid") == "EnhancedFanOutConsumer":  # scoped to the one consumer, not the stream
            assert all(r.endswith(":stream/orders/consumer/orders-app:*") for r in resources), resources
    assert actions == policy_actions(fanout=True) | set(policy_statement(KMS_STATEMENT)["Action"])


def test_the_kms_statement_lets_the_job_read_and_put_an_encrypted_stream_only() -> None:
    """A stream encrypted with a customer-managed KMS key: consumers need ``kms:Decrypt`` and
    producers (``PutRecords``: the publisher, a dead-letter stream) ``kms:GenerateDataKey``, on
    that key, and only when Kinesis asks for this stream (its ARN is the encryption context)."""
    kms = policy_statement(KMS_STATEMENT)
    assert set(kms["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey"}
    stream_arn = policy_statement("ReadAndPutTheStream")["Resource"]
    assert kms["Condition"] == {"StringEquals": {"kms:EncryptionContext:aws:kinesis:arn": stream_arn}}
    assert "kinesis:PutRecords" in policy_statement("ReadAndPutTheStream")["Action"]  # what GenerateDataKey serves


def test_the_kcl_statement_allows_exactly_what_a_kcl_lease_store_calls() -> None:
    """``--kcl-application APP``: the job reads and writes KCL's own table (named after the
    application), never creates or deletes in it; the statement holds the operations the
    KclLeaseStore modules call, no more."""
    kcl = policy_statement(KCL_STATEMENT)
    called = {a for a, modules in operations_called(fanout=False).items() if set(modules) & set(KCL_MODULES)}
    assert called == {"dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                      "dynamodb:Scan"}, called
    assert set(kcl["Action"]) == called
    assert kcl["Resource"].endswith(":table/orders-app")  # the application name of the README's example
    assert kcl["Resource"] != policy_statement("LeaseTable")["Resource"]


@pytest.mark.parametrize("fanout", [False, True], ids=["polling", "fanout"])
def test_the_policy_allows_exactly_the_calls_of_each_mode(fanout: bool) -> None:
    called = operations_called(fanout=fanout)
    assert set(OPT_IN) <= set(operations_called(fanout=True)), "an opt-in operation no longer in the code"
    needed = set(called) - set(OPT_IN)
    allowed = policy_actions(fanout=fanout)
    missing = {a: sorted(called[a]) for a in needed - allowed}
    assert not missing, f"called by the library but not allowed by the policy: {missing}"
    assert allowed <= needed, f"allowed but never called (not least privilege): {sorted(allowed - needed)}"
    assert ("kinesis:SubscribeToShard" in needed) is fanout


def test_the_call_collection_sees_both_ways_of_calling_aws() -> None:
    called = operations_called(fanout=True)
    assert "leases/dynamodb.py" in called["dynamodb:UpdateItem"]  # a boto3 client method
    assert "fanout_http.py" in called["kinesis:SubscribeToShard"]  # an operation name signed by botocore


def import_pipeline() -> Any:
    """cluster/pipeline.py as a module (it is a script, not part of the package)."""
    sys.path.insert(0, str(CLUSTER))
    try:
        import pipeline
    finally:
        sys.path.remove(str(CLUSTER))
    return pipeline


def test_the_pipeline_reads_flags_over_environment() -> None:
    pipeline = import_pipeline()
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
    assert pipeline.stream_config(cfg).retrieval == "polling"
    fan = pipeline.parse_args(["--fanout", "orders-app"], env)
    assert fan.fanout == "orders-app" and pipeline.parse_args([], {**env, "KA_FANOUT": "a"}).fanout == "a"
    stream = pipeline.stream_config(fan)
    assert (stream.retrieval, stream.consumer_name) == ("fanout", "orders-app")
    assert pipeline.start_position("2024-01-01T00:00:00").timestamp_ms == 1704067200000


def test_the_pipeline_sets_the_sizing_knobs_and_a_kcl_lease_table() -> None:
    pipeline = import_pipeline()
    from kinesis_actors import DynamoLeaseStore, KclLeaseStore, KinesisStream

    env = {"KA_STREAM": "orders", "KA_KCL_APPLICATION": "orders-app", "KA_MAX_SHARDS_PER_READER": "10",
           "KA_MIN_CHECKPOINT_INTERVAL_S": "5", "KA_LEASE_POLL_INTERVAL_S": "4", "KA_READER_NUM_CPUS": "1"}
    cfg = pipeline.parse_args([], env)
    stream = pipeline.stream_config(cfg)
    assert (stream.max_shards_per_reader, stream.min_checkpoint_interval_s, stream.lease_poll_interval_s) == (
        10, 5.0, 4.0)
    assert stream.reader_options == {"num_cpus": 1.0}
    assert isinstance(pipeline.lease_store(cfg), KclLeaseStore)
    flags = pipeline.parse_args(["--max-shards-per-reader", "50"], env)
    assert pipeline.stream_config(flags).max_shards_per_reader == 50  # a flag wins over its variable
    unset = pipeline.parse_args(["--stream", "orders", "--lease-table", "orders-leases"], {})
    defaults = KinesisStream("orders")
    assert pipeline.stream_config(unset) == dataclasses.replace(defaults, start_at=pipeline.stream_config(unset).start_at)
    store = pipeline.lease_store(unset)
    assert isinstance(store, DynamoLeaseStore) and not isinstance(store, KclLeaseStore)
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--lease-table", "t"], env)  # a KCL table and a lease table: which one?
    with pytest.raises(SystemExit):
        pipeline.parse_args(["--create-lease-table"], env)  # a KCL table is never created


def test_one_sizing_rule_in_the_guide_the_cluster_readme_and_the_pipeline_help() -> None:
    """docs/production.md, cluster/README.md and ``pipeline.py --help`` give the same rule: per-MB
    and per-request cost, half a core per reader; the older per-MB-only rules are gone."""
    import contextlib
    import io

    pipeline = import_pipeline()
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        pipeline.parse_args(["--help"], {})
    texts = {"docs/production.md": (REPO / "docs" / "production.md").read_text(),
             "cluster/README.md": (CLUSTER / "README.md").read_text(),
             "pipeline.py --help": " ".join(help_text.getvalue().split())}
    for where, text in texts.items():
        flat = " ".join(text.split())
        # the per-MB term is the measured figure: filled in where it is generated, pointed to elsewhere (the
        # README names docs/production.md in other sections too, so the pointer is matched with its term)
        per_mb = ("{{ throughput.product_readers_coordinator_cpu_s_per_mb_after_start }}" if where.startswith("docs")
                  else "per MB that docs/production.md")
        assert per_mb in flat and "0.001" in flat and "<= 0.5" in flat, where  # per MB, per request, half a core
        assert "reader_target_cpu" in flat, where  # what load placement does by itself
        assert "0.10 <= 1" not in flat and "57 / b" not in flat, where
        assert "0.0087" not in flat, where  # a per-MB figure written by hand goes stale with the next bench run
