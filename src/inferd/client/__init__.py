"""inferd's client: reaches KServe v2 servers (inferd, Triton) over the wire, never through their
code. Used by the `remote` runtime (a model served by another process) and by the tools."""

from inferd.client.grpc import GrpcInferenceClient

__all__ = ["GrpcInferenceClient"]
