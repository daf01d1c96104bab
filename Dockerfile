# inferd's container image: slim, non-root, with a health check.
#
#   docker build -t inferd:0.1.0 .
#   docker build -t inferd:0.1.0-torch --build-arg EXTRAS=pytorch \
#       --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu .   # + PyTorch (CPU)
#   docker run -p 8000:8000 -v "$PWD/examples/model_repository:/models:ro" inferd:0.1.0
#
# The models come from INFERD_MODEL_REPOSITORY (/models by default: mount a folder there) or from
# the arguments (`serve --model-repository s3://bucket/models ...`, as inferd deploy writes them).
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# Extras from pyproject.toml, comma-separated (e.g. "pytorch", "tracing" for OpenTelemetry); none by default.
ARG EXTRAS=""
ARG PIP_EXTRA_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src/ src/
RUN python -m venv /opt/inferd \
    && /opt/inferd/bin/pip install ".${EXTRAS:+[$EXTRAS]}"

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="inferd" \
      org.opencontainers.image.description="Model serving: KServe v2 REST and gRPC, Triton repositories, ONNX Runtime" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 inferd \
    && useradd --system --uid 10001 --gid inferd --home-dir /home/inferd --create-home inferd
COPY --from=build /opt/inferd /opt/inferd
ENV PATH=/opt/inferd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    INFERD_MODEL_REPOSITORY=/models
USER 10001:10001
WORKDIR /home/inferd
# KServe v2 HTTP, gRPC, Prometheus metrics (SageMaker mode: `serve --sagemaker` listens on 8080).
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 CMD ["inferd", "health"]
ENTRYPOINT ["inferd"]
CMD ["serve", "--log-format", "json"]
