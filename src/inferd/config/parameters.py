"""Every key of config.pbtxt's `parameters` map that inferd reads, in one table.

Each module that reads one names it through its entry here (`ALLOW_SPINNING.name`), so the docs'
reference (docs/reference/config.md, generated from `MODEL_PARAMETERS`) lists every parameter
inferd acts on and nothing else, and a unit test finds a key read anywhere else. A Python model
gets the whole map in `initialize(args["parameters"])`: its own keys are its own business.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelParameter:
    """A `parameters { key: NAME value { string_value: "..." } }` entry inferd reads."""

    name: str
    # Which models it applies to: a runtime, a door, or every model of a kind.
    applies_to: str
    # What an absent key means.
    default: str
    meaning: str


# ONNX Runtime (runtimes/onnx.py): with --intra-op-pools per-instance only; the shared pool ignores them.
INTRA_OP_THREAD_COUNT = ModelParameter(
    "intra_op_thread_count",
    "ONNX Runtime models, with `--intra-op-pools per-instance`",
    "the cores / the model's instances",
    "Threads of each instance's own intra-op pool.",
)
INTER_OP_THREAD_COUNT = ModelParameter(
    "inter_op_thread_count",
    "ONNX Runtime models, with `--intra-op-pools per-instance`",
    "1",
    "Threads of each instance's inter-op pool.",
)
ALLOW_SPINNING = ModelParameter(
    "allow_spinning",
    "ONNX Runtime models, with `--intra-op-pools per-instance`",
    "false",
    "`true` lets the intra-op threads spin between operators (lower latency, CPU burnt while idle).",
)
ENABLE_TENSORRT = ModelParameter(
    "enable_tensorrt",
    "ONNX Runtime models on a GPU",
    "false",
    "`true` tries TensorRT's execution provider before CUDA's.",
)
CUDNN_CONV_ALGO_SEARCH = ModelParameter(
    "cudnn_conv_algo_search",
    "ONNX Runtime models on a GPU",
    "0 (EXHAUSTIVE)",
    "How CUDA's provider picks each convolution's cuDNN algorithm, as Triton reads it: `0` "
    "(EXHAUSTIVE: every algorithm timed whenever the input shape changes), "
    "`1` (HEURISTIC: cuDNN's guess, no timing) or `2` (DEFAULT: one fixed algorithm).",
)
# TensorFlow SavedModels (runtimes/tensorflow.py), as Triton's TensorFlow backend names them.
TF_SIGNATURE_DEF = ModelParameter(
    "TF_SIGNATURE_DEF",
    "TensorFlow SavedModels",
    "serving_default",
    "The SavedModel signature served (its inputs and outputs are the model's).",
)
TF_GRAPH_TAG = ModelParameter(
    "TF_GRAPH_TAG",
    "TensorFlow SavedModels",
    "serve",
    "The tag of the SavedModel's MetaGraph loaded.",
)
# TensorFlow SavedModels and PyTorch models (runtimes/tensorflow.py, runtimes/pytorch.py).
MIXED_PRECISION = ModelParameter(
    "MIXED_PRECISION",
    "TensorFlow SavedModels (on the CPU) and PyTorch models",
    "none: the model computes in its own types",
    '`"bfloat16"` computes in bfloat16 where it is safe, inputs and outputs unchanged: TensorFlow\'s '
    "grappler rewrites this model's graph with oneDNN's bfloat16 auto mixed precision (other models "
    "in the server are untouched); PyTorch runs the model under `torch.autocast` and returns float32 "
    "outputs as float32. A CPU without bfloat16 arithmetic (AVX512-BF16, AMX) is slower at it: the "
    "load logs a warning.",
)
# Any batched model (runtimes/padded.py).
ALLOWED_BATCH_SIZES = ModelParameter(
    "allowed_batch_sizes",
    "models with max_batch_size > 0 (not sequence batching, not decoupled)",
    "every size from 1 to max_batch_size",
    "Sizes every execution's batch is padded up to, as TF Serving's batching parameter: ascending, "
    'the last one max_batch_size (`"32"`: every batch 32 rows). Padding rows copy the first row; '
    "their outputs are dropped; an execution whose padding would add over 64 MiB runs unpadded, and a "
    "padded model never runs inline on the event loop. For runtimes that pay for a new input shape "
    "(ONNX Runtime's CUDA provider: see the repository page's GPU section).",
)
# The built-in tokenizer model (runtimes/tokenizer.py).
PADDING = ModelParameter(
    "padding",
    "tokenizer models",
    "the tokenizer file's own padding, else the longest text of each batch",
    "`longest` (each batch padded to its longest text) or `max_length` (every row to `max_length`).",
)
MAX_LENGTH = ModelParameter(
    "max_length", "tokenizer models", "no truncation", "Tokens per text at most: longer texts are truncated."
)
PAD_TO_MULTIPLE_OF = ModelParameter(
    "pad_to_multiple_of", "tokenizer models", "none", "Pad each batch's length up to a multiple of this."
)
# Remote models (runtimes/remote.py): a model another server serves.
REMOTE_URL = ModelParameter(
    "url",
    'remote models (`backend: "remote"`)',
    "required",
    "host:port of the server that serves the model (its HTTP port, or its gRPC port with `protocol: grpc`).",
)
REMOTE_PROTOCOL = ModelParameter(
    "protocol", "remote models", "http", "`http` or `grpc`: how the remote server is called."
)
REMOTE_MODEL_NAME = ModelParameter("model_name", "remote models", "this model's name", "The model's name there.")
REMOTE_MODEL_VERSION = ModelParameter(
    "model_version", "remote models", "the remote server's choice", "The model's version there."
)
REMOTE_TIMEOUT_MS = ModelParameter("timeout_ms", "remote models", "10000", "Milliseconds one remote call may take.")
REMOTE_MAX_IN_FLIGHT = ModelParameter("max_in_flight", "remote models", "64", "Remote calls at once at most.")
REMOTE_CONNECTIONS = ModelParameter(
    "connections", "remote models over gRPC", "2", "Kept-alive HTTP/2 channels to the remote server."
)
# Dynamic batching (config/loader.py).
QUEUE_INCLUDES_EXECUTING = ModelParameter(
    "max_queue_size_includes_executing",
    "models with dynamic batching and a `max_queue_size`",
    "true with one priority level, else false",
    "Whether requests executing count toward `max_queue_size` (TF Serving's bound) or only queued ones.",
)
# Scale to zero (config/scale_to_zero.py, core/idle_unload.py).
IDLE_UNLOAD_SECONDS = ModelParameter(
    "idle_unload_seconds",
    "every model",
    "the server's --idle-unload-seconds (off unless given)",
    "Seconds with nothing in flight, queued or waiting in an async backlog after which the model is "
    "unloaded (scaled to zero); its next request loads it again. `0` keeps it loaded whatever the server's default.",
)
MAX_HELD = ModelParameter(
    "max_held",
    "every model that loads on a request's demand (scaled to zero, or under a memory budget)",
    "the server's --max-held (1024); for a model never loaded yet (under a budget), always the server's",
    "Requests that may wait for the model's cold start at once; past them a request gets 503 with "
    "Retry-After, saying the model is starting.",
)
# The doors.
VERSION_LABELS = ModelParameter(
    "version_labels",
    "every model, for TF Serving's doors",
    "no labels",
    "Labels of versions, such as `stable:1,canary:2`: TF Serving's `/labels/stable` and `version_label`.",
)
TORCHSERVE_BODY_INPUT = ModelParameter(
    "torchserve_body_input",
    "every model, for the TorchServe door",
    "the model's only BYTES input",
    "The BYTES input a raw (non-JSON) `/predictions` body goes to, one body per row.",
)
EMBEDDING_INPUT = ModelParameter(
    "embedding_input",
    "models served as OpenAI embeddings",
    "not served as embeddings",
    "The BYTES input that takes one text per row: names the model to the OpenAI door.",
)
EMBEDDING_OUTPUT = ModelParameter(
    "embedding_output", "models served as OpenAI embeddings", "the only output", "The output that holds the vectors."
)
EMBEDDING_TOKEN_COUNT = ModelParameter(
    "embedding_token_count",
    "models served as OpenAI embeddings",
    "no token counts (usage 0)",
    "The output that counts each text's tokens, for `usage`.",
)
EMBEDDING_DIMENSIONS = ModelParameter(
    "embedding_dimensions",
    "models served as OpenAI embeddings",
    "only the model's own dimensions",
    "`truncate` allows a smaller `dimensions`: the first ones, re-normalized (Matryoshka models).",
)

MODEL_PARAMETERS: tuple[ModelParameter, ...] = (
    INTRA_OP_THREAD_COUNT,
    INTER_OP_THREAD_COUNT,
    ALLOW_SPINNING,
    ENABLE_TENSORRT,
    CUDNN_CONV_ALGO_SEARCH,
    TF_SIGNATURE_DEF,
    TF_GRAPH_TAG,
    MIXED_PRECISION,
    ALLOWED_BATCH_SIZES,
    PADDING,
    MAX_LENGTH,
    PAD_TO_MULTIPLE_OF,
    REMOTE_URL,
    REMOTE_PROTOCOL,
    REMOTE_MODEL_NAME,
    REMOTE_MODEL_VERSION,
    REMOTE_TIMEOUT_MS,
    REMOTE_MAX_IN_FLIGHT,
    REMOTE_CONNECTIONS,
    QUEUE_INCLUDES_EXECUTING,
    IDLE_UNLOAD_SECONDS,
    MAX_HELD,
    VERSION_LABELS,
    TORCHSERVE_BODY_INPUT,
    EMBEDDING_INPUT,
    EMBEDDING_OUTPUT,
    EMBEDDING_TOKEN_COUNT,
    EMBEDDING_DIMENSIONS,
)
