"""Endpoints on Kubernetes: each variant its own pods, the split the platform's own (a Gateway API
HTTPRoute's weights), and a new revision of the heaviest variant shipped by Argo Rollouts (its
Gateway API traffic-router plugin), judged by an AnalysisTemplate of inferd's PromQL with the
guards `inferd rollout` uses. Plain dicts, written as YAML by `kustomize.py`.

For an endpoint E with variants V1 (the heaviest, "primary") ... Vn:

- every variant's pods run inferd with its model and a one-variant endpoint E of their own (a
  ConfigMap's file), so their requests are counted as E's and V's, as one server counts them;
- Vn (n > 1) is a Deployment and a Service; V1 is an Argo `Rollout` (the same pod template) with
  a stable and a canary Service, and a metrics Service that selects all its pods (the two others
  select the same pods outside a rollout: scraped through them, every request would count twice);
- the HTTPRoute sends `/v2/models/E` to V1's stable Service with weight 100, its canary Service
  with 0, and each other variant with 100 times its weight over V1's: the plugin sets canary to P
  and stable to 100 - P, so a step of P% moves P% of V1's share, and the other variants keep
  theirs;
- the Rollout's steps are the strategy's shares below 100, each baked, then judged by the
  `judge` AnalysisTemplate (once, at the end of the bake: too few requests is inconclusive, which
  pauses the Rollout, as `inferd rollout` pauses); the `watch` template runs in the background
  from the first step and aborts at the first failed guard, as `inferd rollout` rolls back at once.
  After the last step, Argo promotes (the last share, 100%, is its promotion);
- the guards compare the canary's pods with the stable's (Argo's `rollouts-pod-template-hash` pod
  label, which the ServiceMonitor copies onto the series) by `inferd.rollout_queries`' expressions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from inferd import rollout_queries as queries
from inferd.tools.deploy.k8s import (
    HTTP,
    METRICS,
    NAME,
    PART_OF,
    DeploySettings,
    Manifest,
    pod_spec,
    resource_name,
    resources_of,
    serve_args,
    server_container,
)
from inferd.tools.plan.plan_file import Plan
from inferd.types import WINDOW_S

ENDPOINT = "inferd.dev/endpoint"
VARIANT = "inferd.dev/variant"
SCRAPED = "inferd.dev/scrape"
# The pod label Argo Rollouts gives each revision's pods, and the series' label it becomes.
POD_TEMPLATE_HASH = "rollouts-pod-template-hash"
HASH_LABEL = "rollouts_pod_template_hash"
PLUGIN = "argoproj-labs/gatewayAPI"
PLUGIN_VERSION = "v0.15.0"
ENDPOINTS_MOUNT = "/etc/inferd/endpoints"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class DeployedVariant:
    name: str
    model: str
    version: str
    weight: float


@dataclass(frozen=True, slots=True)
class DeployedEndpoint:
    name: str
    variants: tuple[DeployedVariant, ...]
    primary_name: str
    """The heaviest variant (`core.endpoints.EndpointSpec.primary`): the one Argo ships new
    revisions of."""

    @property
    def primary(self) -> DeployedVariant:
        return next(v for v in self.variants if v.name == self.primary_name)


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    gateway: str
    """The Gateway the HTTPRoutes attach to, and its namespace ("" for the endpoints' own)."""
    gateway_namespace: str
    prometheus_url: str
    shares: tuple[float, ...]
    """The candidate's share at each step (inferd rollout's strategy; the last is 100)."""
    bake_s: float
    min_requests: int = 100
    max_error_rate_delta: float = 0.05
    max_p99_ratio: float = 1.5
    min_p99_delta_s: float = 0.02
    scrape_interval_s: float = 15.0

    def __post_init__(self) -> None:
        if not any(share < 100 for share in self.shares):
            raise ValueError(
                "Argo promotes after a Rollout's last step, and judges only the steps before it: the rollout "
                "strategy needs a step below 100% (canary:P, or linear:K with K of 2 or more)"
            )

    @property
    def range_s(self) -> float:
        """The judged window: the bake, at most a minute (as one server judges), and at least four
        scrape intervals (shorter ranges may hold one sample a series)."""
        return queries.judged_range_s(min(WINDOW_S, self.bake_s), self.scrape_interval_s)


def endpoint_objects(
    endpoint: DeployedEndpoint, plan: Plan, settings: DeploySettings, rollout: RolloutSettings
) -> list[Manifest]:
    """Everything one endpoint needs in its namespace."""
    _check_names(endpoint)
    primary = endpoint.primary
    documents: list[Manifest] = [_endpoint_files(endpoint, settings)]
    for variant in endpoint.variants:
        template = _pod_template(endpoint, variant, plan, settings)
        if variant is primary:
            documents += [
                _rollout(endpoint, variant, template, settings, rollout),
                _service(_name(endpoint, variant, "stable"), endpoint, variant, settings),
                _service(_name(endpoint, variant, "canary"), endpoint, variant, settings),
                _service(_name(endpoint, variant, "metrics"), endpoint, variant, settings, scraped=True),
            ]
        else:
            documents += [
                _deployment(endpoint, variant, template, settings),
                _service(_name(endpoint, variant), endpoint, variant, settings, scraped=True),
            ]
    documents += [
        _http_route(endpoint, settings, rollout),
        _analysis(endpoint, rollout, settings, background=False),
        _analysis(endpoint, rollout, settings, background=True),
    ]
    return documents


def service_monitor(settings: DeploySettings, rollout: RolloutSettings) -> Manifest:
    """The Prometheus Operator's scrape of every endpoint pod, once each (their metrics Services),
    with Argo's revision label copied onto the series."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "inferd-endpoints", "labels": _labels("endpoints", settings)},
        "spec": {
            "selector": {"matchLabels": {NAME: "inferd", SCRAPED: "endpoint"}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": f"{rollout.scrape_interval_s:g}s"}],
            "podTargetLabels": [POD_TEMPLATE_HASH],
        },
    }


def plugin_rights(settings: DeploySettings) -> list[Manifest]:
    """The rights the Gateway API plugin (run by Argo Rollouts' controller) needs on the endpoints'
    routes and Services: in their namespace only."""
    name = "inferd-argo-rollouts-gatewayapi"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "labels": _labels("endpoints", settings)},
            "rules": [
                {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]},
                {
                    "apiGroups": ["gateway.networking.k8s.io"],
                    "resources": ["httproutes"],
                    "verbs": ["get", "list", "update", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "labels": _labels("endpoints", settings)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "argo-rollouts", "namespace": "argo-rollouts"}],
        },
    ]


def plugin_objects() -> list[Manifest]:
    """What the cluster's operator applies once, in Argo Rollouts' own namespace: the Gateway API
    plugin registered (the controller reads it at start: restart it after). It replaces that
    ConfigMap: one that lists other plugins already must have this entry merged into it."""
    location = (
        "https://github.com/argoproj-labs/rollouts-plugin-trafficrouter-gatewayapi/releases/download/"
        f"{PLUGIN_VERSION}/gatewayapi-plugin-linux-amd64"
    )
    plugins = f'- name: "{PLUGIN}"\n  location: "{location}"\n'
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "argo-rollouts-config", "namespace": "argo-rollouts"},
            "data": {"trafficRouterPlugins": plugins},
        },
    ]


def guard_queries(endpoint: str, variant: str, rollout: RolloutSettings, canary: str, stable: str) -> dict[str, str]:
    """The guards' PromQL, by metric name, for the canary's and the stable's pods of `variant`
    (their pod template hashes, or Argo's `{{args.NAME}}`)."""
    candidate = queries.matchers(endpoint, variant, {HASH_LABEL: canary})
    baseline = queries.matchers(endpoint, variant, {HASH_LABEL: stable})
    return {
        "error-rate-delta": queries.error_rate_delta(candidate, baseline, rollout.range_s, rollout.min_requests),
        "p99-slower": queries.p99_slower(
            candidate, baseline, rollout.range_s, f"{rollout.max_p99_ratio:g}", f"{rollout.min_p99_delta_s:g}",
            rollout.min_requests,
        ),
    }  # fmt: skip


# -- the objects -----------------------------------------------------------------------------------


def _name(endpoint: DeployedEndpoint, variant: DeployedVariant, suffix: str = "") -> str:
    return resource_name(f"{endpoint.name}-{variant.name}" + (f"-{suffix}" if suffix else ""))


def _check_names(endpoint: DeployedEndpoint) -> None:
    """Kubernetes names are DNS labels: lower-case letters, digits and '-', 63 at most."""
    for part in (endpoint.name, *(v.name for v in endpoint.variants)):
        if not _DNS_LABEL.fullmatch(part):
            raise ValueError(
                f"endpoint '{endpoint.name}': '{part}' is not a Kubernetes name (lower-case letters, digits and '-')"
            )
    longest = max(len(_name(endpoint, v, "metrics")) for v in endpoint.variants)
    if longest > 63:
        raise ValueError(f"endpoint '{endpoint.name}': its variants' object names would be {longest} characters (63)")


def _labels(component: str, settings: DeploySettings) -> dict[str, str]:
    return {NAME: "inferd", PART_OF: "inferd-endpoints", "app.kubernetes.io/component": component, **settings.labels}


def _selector(endpoint: DeployedEndpoint, variant: DeployedVariant) -> dict[str, str]:
    return {NAME: "inferd", ENDPOINT: endpoint.name, VARIANT: variant.name}


def _endpoint_files(endpoint: DeployedEndpoint, settings: DeploySettings) -> Manifest:
    """Each variant's one-variant endpoint file (`inferd serve --endpoints`): its pods count its
    requests as the endpoint's and the variant's."""
    data = {}
    for variant in endpoint.variants:
        declared = {"name": variant.name, "model": variant.model}
        if variant.version:
            declared["version"] = variant.version
        data[f"{variant.name}.yaml"] = yaml.safe_dump(
            {"endpoints": {endpoint.name: {"variants": [declared]}}}, sort_keys=False
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": resource_name(f"{endpoint.name}-endpoints"), "labels": _labels(endpoint.name, settings)},
        "data": data,
    }


def _pod_template(
    endpoint: DeployedEndpoint, variant: DeployedVariant, plan: Plan, settings: DeploySettings
) -> Manifest:
    planned = plan.models.get(variant.model)
    if planned is None or not planned.instances:
        raise ValueError(f"endpoint '{endpoint.name}', variant '{variant.name}': model '{variant.model}' is not in "
                         "the plan")  # fmt: skip
    # Sized as the bin the plan placed the model on.
    instance = plan.instance(planned.instances[0])
    server_mb = float(plan.settings.get("limits", {}).get("server_memory_mb", 0.0) or 0.0)
    args = [*serve_args(settings.model_repository, (variant.model,), settings),
            "--endpoints", f"{ENDPOINTS_MOUNT}/{variant.name}.yaml"]  # fmt: skip
    container = server_container("inferd", args, settings, resources_of(instance, server_mb))
    container["volumeMounts"].append({"name": "endpoints", "mountPath": ENDPOINTS_MOUNT, "readOnly": True})
    spec = pod_spec([container], settings, instance.type)
    spec["volumes"].append({"name": "endpoints", "configMap": {"name": resource_name(f"{endpoint.name}-endpoints")}})
    return {
        "metadata": {
            "labels": {**_labels(f"{endpoint.name}-{variant.name}", settings), **_selector(endpoint, variant)},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(METRICS),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": spec,
    }


def _deployment(
    endpoint: DeployedEndpoint, variant: DeployedVariant, template: Manifest, settings: DeploySettings
) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": _name(endpoint, variant), "labels": _labels(f"{endpoint.name}-{variant.name}", settings)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": _selector(endpoint, variant)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": template,
        },
    }


def _service(
    name: str, endpoint: DeployedEndpoint, variant: DeployedVariant, settings: DeploySettings, scraped: bool = False
) -> Manifest:
    labels = _labels(f"{endpoint.name}-{variant.name}", settings)
    if scraped:
        labels[SCRAPED] = "endpoint"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": _selector(endpoint, variant),
            "ports": [
                {"name": "http", "port": HTTP, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def _http_route(endpoint: DeployedEndpoint, settings: DeploySettings, rollout: RolloutSettings) -> Manifest:
    primary = endpoint.primary
    backends = [
        {"name": _name(endpoint, primary, "stable"), "port": HTTP, "weight": 100},
        {"name": _name(endpoint, primary, "canary"), "port": HTTP, "weight": 0},
    ]
    for variant in endpoint.variants:
        if variant is not primary:
            # Relative to the primary's 100: the plugin's canary and stable always add up to it. A
            # variant with any weight keeps at least 1.
            weight = round(100 * variant.weight / primary.weight)
            weight = max(weight, 1) if variant.weight > 0 else 0
            backends.append({"name": _name(endpoint, variant), "port": HTTP, "weight": weight})
    parent: Manifest = {"name": rollout.gateway}
    if rollout.gateway_namespace:
        parent["namespace"] = rollout.gateway_namespace
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": resource_name(endpoint.name), "labels": _labels(endpoint.name, settings)},
        "spec": {
            "parentRefs": [parent],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": f"/v2/models/{endpoint.name}"}}],
                    "backendRefs": backends,
                }
            ],
        },
    }


def _hash_args() -> list[Manifest]:
    return [
        {"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}},
        {"name": "stable-hash", "valueFrom": {"podTemplateHashValue": "Stable"}},
    ]


def _analysis_name(endpoint: DeployedEndpoint, background: bool) -> str:
    return resource_name(f"{endpoint.name}-{'watch' if background else 'judge'}")


def _rollout(
    endpoint: DeployedEndpoint, variant: DeployedVariant, template: Manifest, settings: DeploySettings,
    rollout: RolloutSettings,
) -> Manifest:  # fmt: skip
    steps: list[Manifest] = []
    for share in rollout.shares:
        if share >= 100:
            break  # the last step is Argo's promotion
        steps += [
            {"setWeight": max(1, round(share))},
            {"pause": {"duration": f"{max(1, round(rollout.bake_s))}s"}},
            {"analysis": {"templates": [{"templateName": _analysis_name(endpoint, background=False)}],
                          "args": _hash_args()}},
        ]  # fmt: skip
    canary: Manifest = {
        "canaryService": _name(endpoint, variant, "canary"),
        "stableService": _name(endpoint, variant, "stable"),
        "trafficRouting": {
            "plugins": {PLUGIN: {"httpRoute": resource_name(endpoint.name), "namespace": settings.namespace}}
        },
        "analysis": {
            "templates": [{"templateName": _analysis_name(endpoint, background=True)}],
            "startingStep": 1,
            "args": _hash_args(),
        },
        "steps": steps,
    }
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": _name(endpoint, variant), "labels": _labels(f"{endpoint.name}-{variant.name}", settings)},
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": _selector(endpoint, variant)},
            "template": template,
            "strategy": {"canary": canary},
        },
    }


def _analysis(
    endpoint: DeployedEndpoint, rollout: RolloutSettings, settings: DeploySettings, background: bool
) -> Manifest:
    """`judge` (a step's end: once, strict: too few requests is inconclusive) or `watch` (in the
    background, every scrape interval or two: fails at the first guard over its limit, and says
    nothing against a window without enough requests)."""
    guards = guard_queries(
        endpoint.name, endpoint.primary.name, rollout, "{{args.canary-hash}}", "{{args.stable-hash}}"
    )
    limit = f"{rollout.max_error_rate_delta:g}"
    conditions = {
        "error-rate-delta": (f"result[0] <= {limit}", f"result[0] > {limit}"),
        "p99-slower": ("result[0] == 0", "result[0] == 1"),
    }
    metrics = []
    for name, query in guards.items():
        success, failure = conditions[name]
        metric: Manifest = {"name": name}
        if background:
            metric |= {"interval": f"{max(10, round(2 * rollout.scrape_interval_s))}s", "failureLimit": 0,
                       "failureCondition": f"len(result) > 0 && {failure}"}  # fmt: skip
        else:
            metric |= {"count": 1, "successCondition": f"len(result) > 0 && {success}",
                       "failureCondition": f"len(result) > 0 && {failure}"}  # fmt: skip
        metric["provider"] = {"prometheus": {"address": rollout.prometheus_url, "query": query, "timeout": 10}}
        metrics.append(metric)
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": _analysis_name(endpoint, background), "labels": _labels(endpoint.name, settings)},
        "spec": {"args": [{"name": "canary-hash"}, {"name": "stable-hash"}], "metrics": metrics},
    }
