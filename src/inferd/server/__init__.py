"""The transports (KServe v2 REST and gRPC, Prometheus) and the composition root."""
