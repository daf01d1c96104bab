"""config.pbtxt text: the fields inferd reads (tensors, batching, instances, versions, warm-up,
ensembles, sequences, parameters) with values from plain to hostile, and text that is no config."""

from __future__ import annotations

from hypothesis import strategies as st

# Integers past every field's width, negative ones, and plain ones.
_INTS = st.integers(-3, 64) | st.sampled_from([-(2**31) - 1, 2**31, 2**32, 2**63 - 1, 2**64])
_TYPES = st.sampled_from(
    ["TYPE_FP32", "TYPE_FP16", "TYPE_INT64", "TYPE_UINT8", "TYPE_BOOL", "TYPE_STRING", "TYPE_BF16", "TYPE_INVALID"]
)
_NAMES = st.sampled_from(["x", "y", "INPUT0", "OUTPUT0", "m", ""]) | st.text(alphabet="abcxyz_0", max_size=5)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@st.composite
def _tensor(draw: st.DrawFn) -> str:
    parts = [f"name: {_quoted(draw(_NAMES))}", f"data_type: {draw(_TYPES)}"]
    parts.append(f"dims: [ {', '.join(str(d) for d in draw(st.lists(_INTS, max_size=3)))} ]")
    if draw(st.integers(0, 4)) == 0:
        parts.append(f"reshape: {{ shape: [ {', '.join(str(d) for d in draw(st.lists(_INTS, max_size=3)))} ] }}")
    if draw(st.integers(0, 5)) == 0:
        parts.append(f"optional: {draw(st.sampled_from(['true', 'false']))}")
    return "{ " + " ".join(parts) + " }"


_FIXED = (
    'platform: "onnxruntime_onnx"',
    'backend: "python"',
    'platform: "ensemble"',
    'name: "m"',
    'name: "other"',
    'default_model_filename: "../../etc/passwd"',
    "model_transaction_policy { decoupled: true }",
    "optimization { priority: PRIORITY_MAX }",
    "dynamic_batching { }",
    "version_policy: { all: { } }",
)
_WARMUP_DATA = ("zero_data: true", "random_data: true", 'input_data_file: "../x"')
_KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO", "KIND_MODEL")


@st.composite
def _field(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 10))
    ints = draw(st.lists(_INTS, min_size=1, max_size=3))
    n, name, other = ints[0], _quoted(draw(_NAMES)), _quoted(draw(_NAMES))
    if kind == 0:
        return f"max_batch_size: {n}"
    if kind == 1:
        tensors = ", ".join(draw(st.lists(_tensor(), max_size=2)))
        return f"{draw(st.sampled_from(['input', 'output']))} [ {tensors} ]"
    if kind == 2:
        queue = f"default_queue_policy {{ max_queue_size: {ints[-1]} timeout_action: REJECT }}"
        priorities = f"priority_levels: {draw(_INTS)} default_priority_level: {draw(_INTS)}"
        delays = f"max_queue_delay_microseconds: {n} preferred_batch_size: {ints}"
        return f"dynamic_batching {{ {delays} {queue} {priorities} }}"
    if kind == 3:
        return f"instance_group [ {{ count: {n} kind: {draw(st.sampled_from(_KINDS))} gpus: {ints} }} ]"
    if kind == 4:
        latest, specific = f"latest: {{ num_versions: {n} }}", f"specific: {{ versions: {ints} }}"
        return f"version_policy: {{ {draw(st.sampled_from([latest, specific]))} }}"
    if kind == 5:
        return f"parameters {{ key: {name} value {{ string_value: {_quoted(draw(st.text(max_size=8)))} }} }}"
    if kind == 6:
        data = draw(st.sampled_from(_WARMUP_DATA))
        sample = f"data_type: {draw(_TYPES)} dims: {ints} {data}"
        return f'model_warmup [ {{ name: "w" batch_size: {n} inputs {{ key: {name} value {{ {sample} }} }} }} ]'
    if kind == 7:
        maps = f"input_map {{ key: {name} value: {other} }} output_map {{ key: {other} value: {name} }}"
        return f"ensemble_scheduling {{ step [ {{ model_name: {name} model_version: {n} {maps} }} ] }}"
    if kind == 8:
        control = f"control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: {ints} }} ]"
        inputs = f"control_input [ {{ name: {name} {control} }} ]"
        return f"sequence_batching {{ max_sequence_idle_microseconds: {n} {inputs} }}"
    if kind == 9:
        return draw(st.sampled_from(_FIXED))
    return draw(st.text(max_size=16))


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """A config.pbtxt for a model named "m": fields joined (sometimes truncated mid-way)."""
    text = "\n".join(draw(st.lists(_field(), max_size=6)))
    if text and draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text
