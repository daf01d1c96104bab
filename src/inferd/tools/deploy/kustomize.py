"""`write_k8s`: the plan's objects as a Kustomize tree, and a KServe runtime beside it.

    OUTPUT/base/                 kustomization.yaml, namespace.yaml, bin-NN.yaml (Deployment,
                                 Service, HPA, PDB), routes.yaml, ingress.yaml, pipeline.yaml
    OUTPUT/overlays/staging/     one pod a bin, autoscaling up to 2
    OUTPUT/overlays/production/  two pods a bin at least, at most one down at a time
    OUTPUT/kserve/               ServingRuntime "inferd" and an InferenceService that scales to
                                 zero (KServe's serverless mode), with their kustomization; with
                                 --scale-to-zero, one such InferenceService per bin of the plan
    OUTPUT/async/                with --scale-to-zero and an async queue: the async workers and
                                 the KEDA ScaledObject that scales them (serverless.py)
    OUTPUT/endpoints/            with --endpoints: each endpoint's variants, HTTPRoute, Argo Rollout
                                 and AnalysisTemplates, and the ServiceMonitor (endpoints.py);
                                 argo-rollouts/ in it: the Gateway API plugin's registration, for
                                 the cluster's operator

`kubectl apply -k OUTPUT/overlays/production` deploys the fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from inferd.tools.deploy.endpoints import (
    DeployedEndpoint,
    RolloutSettings,
    endpoint_objects,
    plugin_objects,
    plugin_rights,
    service_monitor,
)
from inferd.tools.deploy.k8s import METRICS, USER_ID, DeploySettings, Manifest, objects
from inferd.tools.deploy.serverless import ServerlessSettings, async_workers, inference_services
from inferd.tools.plan.plan_file import Plan

KSERVE_HTTP, KSERVE_GRPC = 8080, 9000
"""The ports KServe's v2 runtimes listen on (its predictor's container port is 8080)."""


def write_k8s(
    plan: Plan, settings: DeploySettings, output: Path, serverless: ServerlessSettings | None = None
) -> list[Path]:
    """Writes the tree; returns the kustomization folders a user applies. `serverless`: the plan's
    bins scale to zero in KServe's serverless mode too (and async workers with KEDA)."""
    base = output / "base"
    files = objects(plan, settings)
    for name, manifests in files.items():
        _dump(base / name, manifests)
    _dump(base / "kustomization.yaml", [_kustomization(list(files), namespace=settings.namespace)])

    staging = output / "overlays" / "staging"
    _dump(
        staging / "kustomization.yaml",
        [
            _kustomization(
                ["../../base"],
                patches=[
                    _patch("HorizontalPodAutoscaler", [{"op": "replace", "path": "/spec/maxReplicas", "value": 2}]),
                ],
            )
        ],
    )
    production = output / "overlays" / "production"
    _dump(
        production / "kustomization.yaml",
        [
            _kustomization(
                ["../../base"],
                patches=[
                    # Two pods of every bin, so a node's loss or a rollout leaves each model served.
                    _patch("Deployment", [{"op": "replace", "path": "/spec/replicas", "value": 2}]),
                    _patch("HorizontalPodAutoscaler", [{"op": "replace", "path": "/spec/minReplicas", "value": 2}]),
                    _patch(
                        "PodDisruptionBudget",
                        [
                            {"op": "remove", "path": "/spec/maxUnavailable"},
                            {"op": "add", "path": "/spec/minAvailable", "value": 1},
                        ],
                    ),
                ],
            )
        ],
    )

    kserve = output / "kserve"
    _dump(kserve / "servingruntime.yaml", [serving_runtime(settings)])
    services = [inference_service(settings)] if serverless is None else inference_services(plan, settings, serverless)
    _dump(kserve / "inferenceservice.yaml", services)
    _dump(
        kserve / "kustomization.yaml",
        [_kustomization(["servingruntime.yaml", "inferenceservice.yaml"], namespace=settings.namespace)],
    )
    folders = [base, staging, production, kserve]
    if serverless is not None and serverless.async_queue:
        workers = output / "async"
        _dump(workers / "async.yaml", async_workers(settings, serverless))
        _dump(workers / "kustomization.yaml", [_kustomization(["async.yaml"], namespace=settings.namespace)])
        folders.append(workers)
    return folders


def write_endpoints(
    endpoints: list[DeployedEndpoint], plan: Plan, settings: DeploySettings, rollout: RolloutSettings, output: Path
) -> list[Path]:
    """OUT/endpoints/: each endpoint's objects (in the base's namespace: apply the base first), the
    ServiceMonitor and the rights Argo's Gateway API plugin needs there; OUT/endpoints/argo-rollouts/:
    the plugin's registration, for the cluster's operator (Argo Rollouts' namespace). The folders
    a user applies."""
    folder = output / "endpoints"
    files = []
    for endpoint in endpoints:
        _dump(folder / f"{endpoint.name}.yaml", endpoint_objects(endpoint, plan, settings, rollout))
        files.append(f"{endpoint.name}.yaml")
    _dump(folder / "servicemonitor.yaml", [service_monitor(settings, rollout)])
    _dump(folder / "argo-rollouts-rights.yaml", plugin_rights(settings))
    resources = [*files, "servicemonitor.yaml", "argo-rollouts-rights.yaml"]
    _dump(folder / "kustomization.yaml", [_kustomization(resources, namespace=settings.namespace)])
    cluster = folder / "argo-rollouts"
    _dump(cluster / "gatewayapi-plugin.yaml", plugin_objects())
    _dump(cluster / "kustomization.yaml", [_kustomization(["gatewayapi-plugin.yaml"])])
    return [folder, cluster]


def serving_runtime(settings: DeploySettings) -> Manifest:
    """inferd as a KServe ServingRuntime: the storage initializer puts the model repository (Triton's
    layout) at /mnt/models; inferd serves KServe v2 on 8080 (HTTP) and 9000 (gRPC)."""
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": "inferd", "annotations": {"serving.kserve.io/server-type": "inferd"}},
        "spec": {
            "annotations": {"prometheus.kserve.io/port": str(METRICS), "prometheus.kserve.io/path": "/metrics"},
            "supportedModelFormats": [
                {"name": "onnx", "version": "1", "autoSelect": True, "priority": 2},
                {"name": "triton", "version": "2", "autoSelect": True, "priority": 2},
                {"name": "pytorch", "version": "2", "autoSelect": False},
            ],
            "protocolVersions": ["v2", "grpc-v2"],
            "multiModel": False,
            "containers": [
                {
                    "name": "kserve-container",
                    "image": settings.image,
                    "args": [
                        "serve",
                        "--model-repository",
                        "/mnt/models",
                        "--http-port",
                        str(KSERVE_HTTP),
                        "--grpc-port",
                        str(KSERVE_GRPC),
                        "--metrics-port",
                        str(METRICS),
                        "--shutdown-timeout",
                        f"{settings.shutdown_timeout_s:g}",
                        "--log-format",
                        "json",
                    ],
                    "env": [{"name": "HOME", "value": "/tmp"}],
                    "ports": [{"containerPort": KSERVE_HTTP, "protocol": "TCP"}],
                    # inferd is ready once its models serve (not when its port opens): Knative
                    # routes no request to a pod before, and its activator holds them meanwhile.
                    "readinessProbe": {
                        "httpGet": {"path": "/v2/health/ready", "port": KSERVE_HTTP},
                        "periodSeconds": 2,
                        "failureThreshold": 3,
                        "timeoutSeconds": 2,
                    },
                    "securityContext": {
                        "runAsUser": USER_ID,
                        "runAsNonRoot": True,
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
                }
            ],
        },
    }


def inference_service(settings: DeploySettings) -> Manifest:
    """A model served by the runtime in KServe's serverless mode: no pod while no request comes,
    one started by the first (Knative's activator holds it meanwhile), up to four by concurrency."""
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": "minilm",
            "annotations": {
                "serving.kserve.io/deploymentMode": "Serverless",
                "autoscaling.knative.dev/scale-to-zero-pod-retention-period": "5m",
            },
        },
        "spec": {
            "predictor": {
                "minReplicas": 0,
                "maxReplicas": 4,
                "scaleMetric": "concurrency",
                "scaleTarget": 8,
                "model": {
                    "modelFormat": {"name": "onnx"},
                    "runtime": "inferd",
                    "protocolVersion": "v2",
                    "storageUri": settings.model_repository.rstrip("/"),
                },
            },
        },
    }


def _kustomization(resources: list[str], namespace: str = "", patches: list[Manifest] | None = None) -> Manifest:
    document: Manifest = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace:
        document["namespace"] = namespace
    document["resources"] = resources
    if patches:
        document["patches"] = patches
    return document


def _patch(kind: str, operations: list[dict[str, Any]]) -> Manifest:
    return {"target": {"kind": kind}, "patch": yaml.safe_dump(operations, sort_keys=False)}


def _dump(path: Path, documents: list[Manifest]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False, width=120), encoding="utf-8")
