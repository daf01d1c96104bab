"""`inferd deploy`: a plan (`inferd plan`'s plan.json) as what a cluster runs: a Kustomize base and
overlays for Kubernetes, and a KServe ServingRuntime with a scale-to-zero InferenceService."""

from inferd.tools.deploy.k8s import DeploySettings, objects
from inferd.tools.deploy.kustomize import inference_service, serving_runtime, write_k8s

__all__ = ["DeploySettings", "inference_service", "objects", "serving_runtime", "write_k8s"]
