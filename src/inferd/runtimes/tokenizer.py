"""The built-in tokenizer model: Hugging Face `tokenizers` on a `tokenizer.json`, so that text can
enter a pipeline (tokenizer → encoder → pooling) as a BYTES tensor and be batched like any model.

    <model>/config.pbtxt    backend: "tokenizer"   (or leave it out: the file tells)
                            max_batch_size: 64
                            parameters { key: "padding" value { string_value: "longest" } }
    <model>/1/tokenizer.json

One BYTES input (`TEXT` unless the config names its one input otherwise), one UTF-8 text per row;
INT64 outputs `input_ids`, `attention_mask` and `token_type_ids`, [batch, tokens] (a config may
list fewer). Parameters, each optional (the defaults are the tokenizer.json's own settings):

* `padding`: `longest` (pad each batch to its longest text: short texts cost less downstream) or
  `max_length` (always `max_length` tokens: a fixed shape for encoders exported with one).
* `max_length`: truncate longer texts to this many tokens.
* `pad_to_multiple_of`: round the padded length up, so batches of similar texts share a shape
  (and merge in the next model's batcher).

Text that is not valid UTF-8 is the request's mistake: a 400 that names the row.

Threads: `tokenizers` spreads a batch over a pool of its own threads of its own (rayon), one per
core. In a server those cores are busy with the encoder and the event loop, so the pool's threads
wait to be scheduled while the caller waits for them: measured in the sentence-similarity pipeline
under load, a batch of 2 texts took 488 µs that way and 118 µs on the calling thread alone.
Loading a tokenizer model therefore sets `TOKENIZERS_PARALLELISM=false` unless the environment
already says otherwise (the library reads it at each call).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig, ModelSignature, TensorSpec
from inferd.config.parameters import MAX_LENGTH, PAD_TO_MULTIPLE_OF, PADDING
from inferd.errors import ModelConfigError, ModelLoadError, TensorDataError
from inferd.runtimes.base import RuntimeOptions, positive_parameter
from inferd.types import DataType

DEFAULT_MODEL_FILENAME = "tokenizer.json"
DEFAULT_INPUT = "TEXT"
OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")
PADDINGS = ("longest", "max_length")
# Measured: all-MiniLM-L6-v2's 466 KB tokenizer.json holds 6.3 MB resident once loaded.
MEMORY_PER_FILE_BYTE = 14
PARALLELISM_VARIABLE = "TOKENIZERS_PARALLELISM"


def estimate_memory_bytes(model_bytes: int) -> int:
    return model_bytes * MEMORY_PER_FILE_BYTE + (1 << 20)


class TokenizerRuntime:
    def __init__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> None:
        from tokenizers import Tokenizer

        os.environ.setdefault(PARALLELISM_VARIABLE, "false")  # see the module's docstring
        path = version_dir / (config.default_model_filename or DEFAULT_MODEL_FILENAME)
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exceptions for missing or broken files
            raise ModelLoadError(f"model '{config.name}': cannot load the tokenizer {path}: {exc}") from exc
        self._name = config.name
        self._input = _input_name(config)
        self._configure(config)

    @property
    def signature(self) -> ModelSignature:
        return ModelSignature(
            inputs=(TensorSpec(self._input, DataType.BYTES, (-1, 1)),),
            outputs=tuple(TensorSpec(name, DataType.INT64, (-1, -1)) for name in OUTPUTS),
        )

    @property
    def may_run_inline(self) -> bool:
        return True  # only computes; a short batch tokenizes faster than a thread hop

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        texts = inputs[self._input]
        encodings = self._tokenizer.encode_batch(
            [self._decode(element, row) for row, element in enumerate(texts.reshape(len(texts), -1)[:, 0])]
        )
        arrays = {
            "input_ids": lambda: [e.ids for e in encodings],
            "attention_mask": lambda: [e.attention_mask for e in encodings],
            "token_type_ids": lambda: [e.type_ids for e in encodings],
        }
        return {name: np.array(arrays[name](), dtype=np.int64) for name in output_names}

    def close(self) -> None:
        return None

    def _decode(self, element: Any, row: int) -> str:
        if isinstance(element, str):
            return element
        try:
            return bytes(element).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TensorDataError(
                f"model '{self._name}' input '{self._input}' row {row} is not valid UTF-8 text "
                f"({exc.reason} at byte {exc.start}): a tokenizer takes text",
                tensor=self._input,
            ) from None

    def _configure(self, config: ModelConfig) -> None:
        parameters = config.parameters
        padding = parameters.get(PADDING.name, "")
        if padding and padding not in PADDINGS:
            raise ModelConfigError(f"model '{config.name}': parameter padding is {padding!r}; use one of {PADDINGS}")
        max_length = positive_parameter(config, MAX_LENGTH.name)
        multiple = positive_parameter(config, PAD_TO_MULTIPLE_OF.name)
        if max_length is not None:
            self._tokenizer.enable_truncation(max_length=max_length)
        own = self._tokenizer.padding or {}
        pad_token = own.get("pad_token", "[PAD]")
        pad_id = own.get("pad_id", self._tokenizer.token_to_id(pad_token))
        if pad_id is None:
            raise ModelConfigError(f"model '{config.name}': the tokenizer has no padding token '{pad_token}'")
        if padding == "max_length" or (not padding and own.get("length") is not None):
            length = max_length if max_length is not None else own.get("length")
            if length is None:
                raise ModelConfigError(f"model '{config.name}': padding max_length needs the parameter max_length")
        else:
            length = None  # the longest text of each batch
        self._tokenizer.enable_padding(
            pad_id=pad_id,
            pad_token=pad_token,
            pad_type_id=own.get("pad_type_id", 0),
            length=length,
            pad_to_multiple_of=multiple if multiple is not None else own.get("pad_to_multiple_of"),
        )


def _input_name(config: ModelConfig) -> str:
    if not config.inputs:
        return DEFAULT_INPUT
    if len(config.inputs) != 1 or config.inputs[0].datatype is not DataType.BYTES:
        raise ModelConfigError(f"model '{config.name}': a tokenizer takes one input, of TYPE_STRING")
    return config.inputs[0].name
