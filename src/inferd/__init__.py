"""inferd: serve ONNX models over the KServe v2 protocol (REST and gRPC), Triton-compatible."""

__version__ = "0.1.0"
