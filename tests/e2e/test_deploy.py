"""`inferd deploy k8s` through its CLI on a real plan: every overlay renders with `kubectl kustomize`,
built-in kinds pass `kubernetes-validate --strict` (a kind without a schema fails), KServe's kinds
pass its vendored CRD schema strictly, and the objects say what the plan says. The Dockerfile passes
hadolint, copies only what exists, runs as non-root, and its CMD and HEALTHCHECK work against a
real server."""

from __future__ import annotations

import fnmatch
import gzip
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from inferd.testing.models import mlp_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import free_port
from inferd.tools import profiles

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
KSERVE_SCHEMAS = ROOT / "tests" / "data" / "kserve"
KEDA_SCHEMAS = ROOT / "tests" / "data" / "keda"
GATEWAY_SCHEMAS = ROOT / "tests" / "data" / "gateway-api"
ARGO_SCHEMAS = ROOT / "tests" / "data" / "argo-rollouts"
MONITORING_SCHEMAS = ROOT / "tests" / "data" / "prometheus-operator"
# The fields the Gateway API traffic router plugin reads from its block of a Rollout
# (GatewayAPITrafficRouting, argoproj-labs/rollouts-plugin-trafficrouter-gatewayapi v0.15.0): the
# Rollout's schema leaves the block free-form.
PLUGIN_FIELDS = {"httpRoute", "httpRoutes", "grpcRoute", "grpcRoutes", "tcpRoute", "tcpRoutes", "tlsRoute",
                 "tlsRoutes", "httpRouteSelector", "namespace", "disableInProgressLabel", "inProgressLabelKey",
                 "inProgressLabelValue"}  # fmt: skip
KUBERNETES_VERSION = "1.33.0"


def inferd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferd", *args], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip


def render(folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused where it lists the fields (as --validate=strict does)."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):  # fmt: skip
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def crd_validator(folder: Path, kind: str, version: str) -> jsonschema.Draft7Validator:
    """A custom resource's vendored schema (KServe's, KEDA's, the Gateway API's, Argo Rollouts', the
    Prometheus Operator's), strict."""
    record = json.loads(gzip.decompress((folder / f"{kind}.schema.json.gz").read_bytes()))
    schema = strict(record["versions"][version])
    schema["properties"]["metadata"] = {"type": "object"}  # what the API server checks for every kind
    return jsonschema.Draft7Validator(schema)


def validate(document: dict[str, Any]) -> None:
    group, _, version = document["apiVersion"].rpartition("/")
    custom = {
        "serving.kserve.io": KSERVE_SCHEMAS,
        "keda.sh": KEDA_SCHEMAS,
        "gateway.networking.k8s.io": GATEWAY_SCHEMAS,
        "argoproj.io": ARGO_SCHEMAS,
        "monitoring.coreos.com": MONITORING_SCHEMAS,
    }
    if group in custom:
        errors = list(crd_validator(custom[group], document["kind"], version).iter_errors(document))
        assert not errors, f"{document['kind']}: {[(list(e.absolute_path), e.message) for e in errors[:3]]}"
        return
    # SchemaNotFoundError (a kind it cannot check) propagates: a failure, not a warning.
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 MiniLM-sized models, two replicas each, planned on small instances (a few bins)."""
    folder = tmp_path_factory.mktemp("plan")
    best = profiles.Operating(56.0, 40.0, 80.0, 8, cpu_cores=2.0)
    model = profiles.ModelProfile(1500.0, 2.0, best, best)
    profile = profiles.Profile(profiles.Machine("cpu A", 2, 24.0), {f"model-{i:02d}": model for i in range(30)},
                               server_memory_mb=250.0)  # fmt: skip
    profiles.write(profile, folder / "profile.json")
    result = inferd("plan", str(folder / "profile.json"), "-o", str(folder), "--zipf-total", "30", "--replicas", "2",
                    "--instance-types", "m6i.xlarge,m6i.2xlarge", "--time-limit", "10")  # fmt: skip
    assert result.returncode == 0, result.stderr
    return folder / "plan.json"


@pytest.mark.timeout(300)
def test_manifests_render_validate_and_follow_the_plan(plan_path: Path, tmp_path: Path) -> None:
    plan = json.loads(plan_path.read_text())
    output = tmp_path / "k8s"
    result = inferd("deploy", "k8s", str(plan_path), "-o", str(output), "--model-repository", "s3://models/fleet",
                    "--image", "registry.example/inferd:1.0", "--shutdown-timeout", "20",
                    "--pipeline-front", "s3://models/front", "--pipeline-model", "s3://models/model-side",
                    "--pipeline-routes", "sentence_similarity")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "kubectl apply -k" in result.stdout

    rendered = {name: render(output / name) for name in ("base", "overlays/staging", "overlays/production", "kserve")}
    for documents in rendered.values():
        for document in documents:
            validate(document)

    base = rendered["base"]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for document in base:
        by_kind.setdefault(document["kind"], []).append(document)
        assert document["kind"] == "Namespace" or document["metadata"]["namespace"] == "inferd"
    bins = {i["name"]: i for i in plan["instances"]}
    deployments = {d["metadata"]["name"]: d for d in by_kind["Deployment"]}
    assert set(deployments) == {f"inferd-{name}" for name in bins} | {"inferd-pipeline"}
    pods = {}
    for name, instance in bins.items():
        deployment = deployments[f"inferd-{name}"]
        pod = deployment["spec"]["template"]
        pods[name] = pod["metadata"]["labels"]
        container = pod["spec"]["containers"][0]
        args = container["args"]
        loaded = [args[i + 1] for i, arg in enumerate(args) if arg == "--load-model"]
        assert sorted(loaded) == sorted(instance["models"])
        assert args[:5] == ["serve", "--model-repository", "s3://models/fleet", "--model-control-mode", "explicit"]
        assert container["image"] == "registry.example/inferd:1.0"
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300
        assert pod["spec"]["terminationGracePeriodSeconds"] > 20 + 5  # the drain plus the preStop pause
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == instance["type"]
        assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        requested = container["resources"]["requests"]
        assert requested["memory"] == f"{instance['used']['memory_mb'] + 250 + 128}Mi"
        assert requested["cpu"] == f"{max(100, instance['used']['cpu_milli'] + 100)}m"

    # Every model's path goes to a Service whose pods are exactly the bins holding the model.
    services = {s["metadata"]["name"]: s["spec"]["selector"] for s in by_kind["Service"]}
    (ingress,) = by_kind["Ingress"]
    paths = {p["path"]: p["backend"]["service"]["name"] for p in ingress["spec"]["rules"][0]["http"]["paths"]}
    assert "non_idempotent" in ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-next-upstream"]
    for name, model in plan["models"].items():
        selector = services[paths[f"/v2/models/{name}"]]
        selected = {b for b, labels in pods.items() if selector.items() <= labels.items()}
        assert selected == set(model["instances"]), name
    assert paths["/v2/models/sentence_similarity"] == "inferd-pipeline"
    pipeline = deployments["inferd-pipeline"]["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in pipeline] == ["model", "front"]
    assert "127.0.0.1" in pipeline[0]["args"] and "s3://models/front" in pipeline[1]["args"]
    assert {h["spec"]["scaleTargetRef"]["name"] for h in by_kind["HorizontalPodAutoscaler"]} == {
        f"inferd-{name}" for name in bins
    }
    assert all(p["spec"]["maxUnavailable"] == 1 for p in by_kind["PodDisruptionBudget"])

    production = rendered["overlays/production"]
    assert all(d["spec"]["replicas"] == 2 for d in production if d["kind"] == "Deployment")
    assert all(h["spec"]["minReplicas"] == 2 for h in production if h["kind"] == "HorizontalPodAutoscaler")
    assert all(p["spec"] == {"minAvailable": 1, "selector": p["spec"]["selector"]}
               for p in production if p["kind"] == "PodDisruptionBudget")  # fmt: skip
    assert all(h["spec"]["maxReplicas"] == 2 for h in rendered["overlays/staging"]
               if h["kind"] == "HorizontalPodAutoscaler")  # fmt: skip

    kinds = {d["kind"]: d for d in rendered["kserve"]}
    assert kinds["InferenceService"]["spec"]["predictor"]["minReplicas"] == 0  # scales to zero
    assert kinds["InferenceService"]["spec"]["predictor"]["model"]["runtime"] == "inferd"
    assert "/mnt/models" in kinds["ServingRuntime"]["spec"]["containers"][0]["args"]


def test_the_schema_checks_can_fail(plan_path: Path, tmp_path: Path) -> None:
    output = tmp_path / "k8s"
    assert inferd("deploy", "k8s", str(plan_path), "-o", str(output), "--model-repository", "s3://m").returncode == 0
    service = yaml.safe_load((output / "kserve" / "inferenceservice.yaml").read_text())
    service["spec"]["predictor"]["minReplica"] = 0  # a misspelt field
    with pytest.raises(AssertionError, match="minReplica"):
        validate(service)
    deployment = next(yaml.safe_load_all((output / "base" / "bin-00.yaml").read_text()))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate({"apiVersion": "example.com/v1", "kind": "Unknown", "metadata": {"name": "x"}})


ENDPOINTS = """
endpoints:
  shop:
    variants:
      - {name: blue, model: model-00, version: 1, weight: 90}
      - {name: green, model: model-01, version: 2, weight: 10}
      - {name: teal, model: model-02, weight: 0}
"""


@pytest.mark.timeout(300)
def test_an_endpoint_renders_as_variants_an_httproute_and_an_argo_rollout_judged_by_inferds_promql(
    plan_path: Path, tmp_path: Path
) -> None:
    from inferd.tools.deploy.endpoints import RolloutSettings, guard_queries

    (tmp_path / "endpoints.yaml").write_text(ENDPOINTS)
    output = tmp_path / "k8s"
    result = inferd("deploy", "k8s", str(plan_path), "-o", str(output), "--model-repository", "s3://models/fleet",
                    "--endpoints", str(tmp_path / "endpoints.yaml"), "--gateway", "infra/public",
                    "--prometheus-url", "http://prometheus.monitoring:9090", "--rollout-strategy", "linear:4",
                    "--rollout-bake", "2m", "--min-requests", "200", "--scrape-interval", "10s")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"kubectl apply -k {output / 'endpoints'}" in result.stdout
    documents = render(output / "endpoints")
    cluster = render(output / "endpoints" / "argo-rollouts")
    for document in [*documents, *cluster]:
        validate(document)
    objects = {(d["kind"], d["metadata"]["name"]): d for d in documents}
    assert all(d["metadata"]["namespace"] == "inferd" for d in documents)

    # Each variant's pods serve its model and count their requests as the endpoint's and the variant's.
    files = objects[("ConfigMap", "inferd-shop-endpoints")]["data"]
    assert yaml.safe_load(files["green.yaml"]) == {
        "endpoints": {"shop": {"variants": [{"name": "green", "model": "model-01", "version": "2"}]}}
    }
    for kind, name, model in (("Rollout", "inferd-shop-blue", "model-00"), ("Deployment", "inferd-shop-green",
                                                                          "model-01")):  # fmt: skip
        pod = objects[(kind, name)]["spec"]["template"]
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--load-model") + 1] == model
        variant = name.rpartition("-")[2]
        assert args[args.index("--endpoints") + 1] == f"/etc/inferd/endpoints/{variant}.yaml"
        assert objects[(kind, name)]["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()

    # The split is the HTTPRoute's: the primary's stable and canary add up to 100 (the plugin keeps
    # them so), the others relative to the primary's weight.
    route = objects[("HTTPRoute", "inferd-shop")]["spec"]
    assert route["parentRefs"] == [{"name": "public", "namespace": "infra"}]
    (rule,) = route["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v2/models/shop"}}]
    weights = {b["name"]: b["weight"] for b in rule["backendRefs"]}
    assert weights == {"inferd-shop-blue-stable": 100, "inferd-shop-blue-canary": 0, "inferd-shop-green": 11,
                       "inferd-shop-teal": 0}  # fmt: skip
    # The CEL rule the schema check cannot run: a Service backend names its port.
    assert all(b["port"] == 8000 and ("Service", b["name"]) in objects for b in rule["backendRefs"])

    # The Rollout: the Gateway API plugin on that route, Argo's own checks, the steps of linear:4.
    rollout = objects[("Rollout", "inferd-shop-blue")]["spec"]
    canary = rollout["strategy"]["canary"]
    (plugin,) = canary["trafficRouting"]["plugins"].items()
    assert plugin[0] == "argoproj-labs/gatewayAPI" and set(plugin[1]) <= PLUGIN_FIELDS
    assert plugin[1] == {"httpRoute": "inferd-shop", "namespace": "inferd"}
    assert canary["canaryService"] != canary["stableService"]
    assert {canary["canaryService"], canary["stableService"]} <= set(weights)
    assert rollout["selector"]["matchLabels"]
    steps = canary["steps"]
    assert [s["setWeight"] for s in steps if "setWeight" in s] == [25, 50, 75]
    assert all(s["pause"] == {"duration": "120s"} for s in steps if "pause" in s)
    judged = [s["analysis"]["templates"][0]["templateName"] for s in steps if "analysis" in s]
    assert (
        judged == ["inferd-shop-judge"] * 3
        and canary["analysis"]["templates"][0]["templateName"] == "inferd-shop-watch"
    )

    # The guards are inferd's PromQL, over the canary's pods against the stable's (Argo's hash).
    settings = RolloutSettings("public", "infra", "http://prometheus.monitoring:9090", (25.0, 50.0, 75.0, 100.0),
                               120.0, min_requests=200, scrape_interval_s=10.0)  # fmt: skip
    expected = guard_queries("shop", "blue", settings, "{{args.canary-hash}}", "{{args.stable-hash}}")
    for name, strict_judge in (("inferd-shop-judge", True), ("inferd-shop-watch", False)):
        template = objects[("AnalysisTemplate", name)]["spec"]
        metrics = {m["name"]: m for m in template["metrics"]}
        assert {m: metrics[m]["provider"]["prometheus"]["query"] for m in metrics} == expected
        assert all(
            m["provider"]["prometheus"]["address"] == "http://prometheus.monitoring:9090" for m in metrics.values()
        )
        error = metrics["error-rate-delta"]
        assert error["failureCondition"] == "len(result) > 0 && result[0] > 0.05"
        if strict_judge:  # too few requests at the bake's end: inconclusive, and the Rollout pauses
            assert error["count"] == 1 and error["successCondition"] == "len(result) > 0 && result[0] <= 0.05"
        else:  # in the background: fails at once, says nothing without data
            assert "successCondition" not in error and error["failureLimit"] == 0
    assert ">= 200" in expected["error-rate-delta"] and "[60s]" in expected["error-rate-delta"]

    # Scraped once a pod (not through the stable and canary Services too), Argo's hash kept.
    (monitor,) = [d for d in documents if d["kind"] == "ServiceMonitor"]
    scraped = {name for (kind, name), d in objects.items() if kind == "Service"
               and monitor["spec"]["selector"]["matchLabels"].items() <= d["metadata"]["labels"].items()}  # fmt: skip
    assert scraped == {"inferd-shop-blue-metrics", "inferd-shop-green", "inferd-shop-teal"}
    assert monitor["spec"]["podTargetLabels"] == ["rollouts-pod-template-hash"]
    (plugin_config,) = cluster
    assert plugin_config["metadata"] == {"name": "argo-rollouts-config", "namespace": "argo-rollouts"}
    assert "argoproj-labs/gatewayAPI" in plugin_config["data"]["trafficRouterPlugins"]
    # The plugin's rights are the endpoints' namespace's only, for Argo's controller.
    role = objects[("Role", "inferd-argo-rollouts-gatewayapi")]
    assert {tuple(rule["resources"]) for rule in role["rules"]} == {("services",), ("httproutes",)}
    binding = objects[("RoleBinding", "inferd-argo-rollouts-gatewayapi")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "argo-rollouts", "namespace": "argo-rollouts"}]


def test_the_custom_resources_schema_checks_can_fail(plan_path: Path, tmp_path: Path) -> None:
    (tmp_path / "endpoints.yaml").write_text(ENDPOINTS)
    output = tmp_path / "k8s"
    result = inferd("deploy", "k8s", str(plan_path), "-o", str(output), "--model-repository", "s3://m",
                    "--endpoints", str(tmp_path / "endpoints.yaml"), "--gateway", "public",
                    "--prometheus-url", "http://prometheus:9090")  # fmt: skip
    assert result.returncode == 0, result.stderr
    documents = {d["kind"]: d for d in yaml.safe_load_all((output / "endpoints" / "shop.yaml").read_text())}
    for kind, mend in (
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["backendRefs"][0].update(weigth=1)),
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["backendRefs"][0].update(weight=-1)),
        ("Rollout", lambda d: d["spec"]["strategy"]["canary"]["steps"].append({"setWieght": 5})),
        ("Rollout", lambda d: d["spec"]["template"]["metadata"].update(name="x")),
        ("AnalysisTemplate", lambda d: d["spec"]["metrics"][0]["provider"]["prometheus"].update(timeout="10s")),
    ):
        broken = json.loads(json.dumps(documents[kind]))
        mend(broken)
        with pytest.raises(AssertionError, match=kind):
            validate(broken)
    monitor = yaml.safe_load((output / "endpoints" / "servicemonitor.yaml").read_text())
    monitor["spec"]["endpoints"][0]["intervall"] = "1s"
    with pytest.raises(AssertionError, match="ServiceMonitor"):
        validate(monitor)


def test_bad_deploy_arguments_are_one_line_errors(plan_path: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "k8s")
    result = inferd("deploy", "k8s", str(plan_path), "-o", out, "--model-repository", "s3://m",
                    "--pipeline-front", "s3://front")  # fmt: skip
    assert result.returncode == 1 and "needs both --pipeline-front and --pipeline-model" in result.stderr
    (tmp_path / "other.json").write_text('{"schema": "inferd.profile/1"}')
    result = inferd("deploy", "k8s", str(tmp_path / "other.json"), "-o", out, "--model-repository", "s3://m")
    assert result.returncode == 1 and "not an inferd plan" in result.stderr and "Traceback" not in result.stderr
    declared = tmp_path / "endpoints.yaml"
    declared.write_text(ENDPOINTS)
    result = inferd("deploy", "k8s", str(plan_path), "-o", out, "--model-repository", "s3://m", "--endpoints",
                    str(declared), "--prometheus-url", "http://p:9090")  # fmt: skip
    assert result.returncode == 1 and "--endpoints needs --gateway" in result.stderr
    declared.write_text(ENDPOINTS.replace("model: model-02", "model: not-planned"))
    result = inferd("deploy", "k8s", str(plan_path), "-o", out, "--model-repository", "s3://m", "--endpoints",
                    str(declared), "--gateway", "g", "--prometheus-url", "http://p:9090")  # fmt: skip
    assert result.returncode == 1 and "model 'not-planned' is not in the plan" in result.stderr
    declared.write_text(ENDPOINTS)
    result = inferd("deploy", "k8s", str(plan_path), "-o", out, "--model-repository", "s3://m", "--endpoints",
                    str(declared), "--gateway", "g", "--prometheus-url", "http://p:9090",
                    "--rollout-strategy", "all-at-once")  # fmt: skip
    assert result.returncode == 1 and "needs a step below 100%" in result.stderr
    declared.write_text(ENDPOINTS.replace("shop:", "Shop_1:"))
    result = inferd("deploy", "k8s", str(plan_path), "-o", out, "--model-repository", "s3://m", "--endpoints",
                    str(declared), "--gateway", "g", "--prometheus-url", "http://p:9090")  # fmt: skip
    assert result.returncode == 1 and "is not a Kubernetes name" in result.stderr and "Traceback" not in result.stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            keyword, _, rest = pending.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
            pending = ""
    return instructions


def exec_form(arguments: str) -> list[str]:
    value = json.loads(arguments)
    assert isinstance(value, list), f"{arguments}: use the exec form"
    return [str(part) for part in value]


def test_the_dockerfile_lints_copies_what_exists_and_runs_as_non_root() -> None:
    lint = subprocess.run([str(Path(sys.executable).with_name("hadolint")), str(ROOT / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    instructions = dockerfile_instructions()
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]  # fmt: skip

    def sent(path: str) -> bool:  # whether .dockerignore lets `path` into the build context
        included = True
        for pattern in ignore:
            negated = pattern.startswith("!")
            pattern = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                included = negated
        return included

    copies = [shlex.split(arguments) for keyword, arguments in instructions if keyword == "COPY"]
    assert copies
    for parts in copies:
        if any(part.startswith("--from=") for part in parts):
            continue
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert sent(source.rstrip("/")), f"COPY {source}: .dockerignore leaves it out of the context"
    users = [arguments for keyword, arguments in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


@pytest.mark.timeout(120)
def test_the_images_cmd_serves_and_its_healthcheck_tells(tmp_path: Path) -> None:
    instructions = dict(dockerfile_instructions())
    entrypoint, cmd = exec_form(instructions["ENTRYPOINT"]), exec_form(instructions["CMD"])
    options, _, check = instructions["HEALTHCHECK"].partition("CMD ")
    assert "--interval" in options
    health = exec_form(check)
    repository = tmp_path / "models"
    mlp_model(repository / "mlp" / "1" / "model.onnx", seed=1)
    write_model_config(repository / "mlp", "max_batch_size: 8")
    ports = {"INFERD_HTTP_PORT": free_port(), "INFERD_GRPC_PORT": free_port(), "INFERD_METRICS_PORT": free_port()}
    # As the image runs it: its ENV (the repository at INFERD_MODEL_REPOSITORY), ports moved off the
    # defaults so the test cannot collide with anything on this machine.
    env = {**os.environ, "INFERD_MODEL_REPOSITORY": str(repository), **{k: str(v) for k, v in ports.items()}}
    binaries = Path(sys.executable).parent
    command = [str(binaries / entrypoint[0]), *entrypoint[1:], *cmd]
    check_command = [str(binaries / health[0]), *health[1:]]
    assert subprocess.run(check_command, env=env, capture_output=True, timeout=30).returncode == 1  # nothing yet
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(check_command, env=env, capture_output=True, timeout=30).returncode != 0:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the image's CMD never became healthy"
            time.sleep(0.5)
        live = subprocess.run([*check_command, "--live"], env=env, capture_output=True, text=True, timeout=30)
        assert live.returncode == 0 and "live" in live.stdout
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert subprocess.run(check_command, env=env, capture_output=True, timeout=30).returncode == 1


def test_the_queue_autoscaler_reads_inferds_queue_metric(plan_path: Path, tmp_path: Path) -> None:
    output = tmp_path / "k8s"
    result = inferd("deploy", "k8s", str(plan_path), "-o", str(output), "--model-repository", "s3://m",
                    "--autoscale", "queue", "--queue-target", "6", "--max-replicas", "3")  # fmt: skip
    assert result.returncode == 0, result.stderr
    autoscalers = [d for d in render(output / "base") if d["kind"] == "HorizontalPodAutoscaler"]
    assert autoscalers
    for autoscaler in autoscalers:
        validate(autoscaler)
        (metric,) = autoscaler["spec"]["metrics"]
        assert metric["pods"]["metric"]["name"] == "inferd_queue_depth"
        assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "6"}
        assert autoscaler["spec"]["maxReplicas"] == 3


def test_scale_to_zero_renders_each_bin_serverless_and_async_workers_scaled_by_keda(
    plan_path: Path, tmp_path: Path
) -> None:
    """Each bin an InferenceService in Knative mode that scales to zero on concurrency, whose pods
    take no request before their models serve (the runtime's readiness is inferd's) and are not cut
    while they load, and that take async submits; workers that KEDA scales from zero on each
    priority stream's lag, one kept while jobs run. Every document validates (KServe's and KEDA's
    vendored schemas, strict)."""
    plan = json.loads(plan_path.read_text())
    output = tmp_path / "k8s"
    result = inferd("deploy", "k8s", str(plan_path), "-o", str(output), "--model-repository", "s3://models/fleet",
                    "--scale-to-zero", "--scale-target", "6", "--max-load-seconds", "900", "--scale-down-delay", "120",
                    "--async-queue", "redis://redis.inferd:6379/2", "--async-payload-path", "s3://jobs/in",
                    "--async-output-path", "s3://jobs/out", "--async-priorities", "0,5",
                    "--async-concurrency", "4")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"kubectl apply -k {output / 'async'}" in result.stdout
    kserve, workers = render(output / "kserve"), render(output / "async")
    for document in (*kserve, *workers):
        validate(document)

    (runtime,) = [d for d in kserve if d["kind"] == "ServingRuntime"]
    readiness = runtime["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert readiness == {"path": "/v2/health/ready", "port": 8080}  # 200 only once its models serve
    services = {d["metadata"]["name"]: d for d in kserve if d["kind"] == "InferenceService"}
    assert set(services) == {f"inferd-{i['name']}" for i in plan["instances"]}
    for instance in plan["instances"]:
        service = services[f"inferd-{instance['name']}"]
        annotations = service["metadata"]["annotations"]
        assert annotations["serving.kserve.io/deploymentMode"] == "Serverless"
        assert annotations["serving.knative.dev/progress-deadline"] == "900s"  # a pod loading is not cut
        assert annotations["autoscaling.knative.dev/scale-down-delay"] == "120s"
        predictor = service["spec"]["predictor"]
        assert predictor["minReplicas"] == 0 and predictor["scaleTarget"] == 6
        assert predictor["scaleMetric"] == "concurrency"
        assert predictor["timeout"] == 900  # a request held while a pod starts outwaits its load
        args = predictor["model"]["args"]  # appended to the runtime's by KServe
        assert sorted(args[i + 1] for i, arg in enumerate(args) if arg == "--load-model") == sorted(instance["models"])
        # The bins take async submits (they scale with requests) and run no job: the workers do.
        assert args[args.index("--async-concurrency") + 1] == "0"
        assert args[args.index("--async-queue") + 1] == "redis://redis.inferd:6379/2"
        assert args[args.index("--onnx-cache-size") + 1] == "0"  # a pod from zero would write it, never read it

    (scaled,) = [d for d in workers if d["kind"] == "ScaledObject"]
    (deployment,) = [d for d in workers if d["kind"] == "Deployment"]
    assert "replicas" not in deployment["spec"]  # KEDA's
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == 0 and scaled["spec"]["cooldownPeriod"] == 120
    triggers = {t["name"]: t["metadata"] for t in scaled["spec"]["triggers"]}
    assert set(triggers) == {"waiting-0", "running-0", "waiting-5", "running-5"}
    for priority in (0, 5):
        waiting, running = triggers[f"waiting-{priority}"], triggers[f"running-{priority}"]
        # The names inferd's Redis queue uses (core.redis_job_queue through config.async_queue).
        assert waiting["stream"] == running["stream"] == f"inferd:async:stream:{priority}"
        assert waiting["consumerGroup"] == running["consumerGroup"] == "workers"
        assert waiting["address"] == "redis.inferd:6379" and waiting["databaseIndex"] == "2"
        assert waiting["lagCount"] == running["pendingEntriesCount"] == "4"  # jobs a worker runs at once
        assert "enableTLS" not in waiting
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--async-queue") + 1] == "redis://redis.inferd:6379/2"
    assert container["args"][container["args"].index("--async-concurrency") + 1] == "4"

    tls = tmp_path / "tls"
    result = inferd("deploy", "k8s", str(plan_path), "-o", str(tls), "--model-repository", "s3://m", "--scale-to-zero",
                    "--async-queue", "rediss://redis.example:6380", "--async-payload-path", "s3://p",
                    "--async-output-path", "s3://o")  # fmt: skip
    assert result.returncode == 0, result.stderr
    (scaled,) = [d for d in render(tls / "async") if d["kind"] == "ScaledObject"]
    validate(scaled)
    assert {t["metadata"]["address"] for t in scaled["spec"]["triggers"]} == {"redis.example:6380"}
    assert {t["metadata"]["enableTLS"] for t in scaled["spec"]["triggers"]} == {"true"}
    password = inferd("deploy", "k8s", str(plan_path), "-o", str(tmp_path / "pw"), "--model-repository", "s3://m",
                      "--scale-to-zero", "--async-queue", "redis://:secret@r:6379/0", "--async-payload-path", "s3://p",
                      "--async-output-path", "s3://o")  # fmt: skip
    assert password.returncode != 0 and "credentials in the URL" in password.stderr

    refused = inferd("deploy", "k8s", str(plan_path), "-o", str(tmp_path / "bad"), "--model-repository", "s3://m",
                     "--scale-to-zero", "--async-queue", "redis://r:6379/0", "--async-payload-path", "/tmp/x",
                     "--async-output-path", "s3://o")  # fmt: skip
    assert refused.returncode != 0 and "--async-payload-path must be an s3:// place" in refused.stderr
