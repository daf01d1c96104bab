"""The built-in tokenizer model against the `tokenizers` library called directly: padding and
truncation from the config's parameters, batches, names, and text that is not UTF-8."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from inferd.config.loader import read_model_config
from inferd.config.model import InstanceGroup
from inferd.core.loading import load_version
from inferd.core.metrics import NoMetrics
from inferd.errors import ModelConfigError, TensorDataError
from inferd.runtimes import TOKENIZER, Runtime, detect_runtime, load_runtime
from inferd.runtimes.base import RuntimeOptions
from inferd.testing.models import minilm_files, tokenizer_model

OPTIONS = RuntimeOptions(instance_group=InstanceGroup(), intra_op_threads=None)
TEXTS = ["a short one", "a rather longer sentence, with a comma and more words in it", "héllo wörld"]


def runtime(tmp_path: Path, config: str = "") -> Runtime:
    tokenizer_model(tmp_path / "tok", config)
    return load_runtime(read_model_config(tmp_path / "tok"), tmp_path / "tok" / "1", OPTIONS)


def reference(padding_length: int | None, max_length: int | None = None) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(minilm_files() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=padding_length)
    return tokenizer


def encode(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)


def test_defaults_are_the_tokenizer_files_own_settings(tmp_path: Path) -> None:
    model = runtime(tmp_path, "max_batch_size: 8")
    out = model.execute({"TEXT": encode(TEXTS)}, ["input_ids", "attention_mask", "token_type_ids"])
    want = reference(128, 128).encode_batch(TEXTS)
    assert out["input_ids"].shape == (3, 128)
    assert out["input_ids"].tolist() == [e.ids for e in want]
    assert out["attention_mask"].tolist() == [e.attention_mask for e in want]
    assert out["token_type_ids"].dtype == np.int64


def test_longest_padding_and_truncation_from_parameters(tmp_path: Path) -> None:
    model = runtime(
        tmp_path,
        """
        max_batch_size: 8
        input [ { name: "sentence" data_type: TYPE_STRING dims: [ 1 ] } ]
        parameters { key: "padding" value { string_value: "longest" } }
        parameters { key: "max_length" value { string_value: "12" } }
        parameters { key: "pad_to_multiple_of" value { string_value: "8" } }
        """,
    )
    out = model.execute({"sentence": encode(TEXTS)}, ["input_ids"])
    assert list(out) == ["input_ids"]
    ids = out["input_ids"]
    assert ids.shape == (3, 16)  # the longest is truncated to 12, then padded to a multiple of 8
    want = reference(None, 12).encode_batch(TEXTS)
    assert [row[: len(e.ids)] for row, e in zip(ids.tolist(), want, strict=True)] == [e.ids for e in want]


def test_text_that_is_not_utf8_is_the_requests_mistake_naming_the_row(tmp_path: Path) -> None:
    model = runtime(tmp_path, "max_batch_size: 8")
    texts = np.array([[b"fine"], [b"\xff\xfe not text"]], dtype=object)
    with pytest.raises(TensorDataError, match="input 'TEXT' row 1 is not valid UTF-8 text"):
        model.execute({"TEXT": texts}, ["input_ids"])


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ('parameters { key: "padding" value { string_value: "sideways" } }', "parameter padding is 'sideways'"),
        ('parameters { key: "max_length" value { string_value: "-3" } }', "max_length must be a positive integer"),
    ],
)
def test_bad_parameters_fail_the_load(tmp_path: Path, parameters: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        runtime(tmp_path, f"max_batch_size: 8\n{parameters}")


def test_config_is_completed_from_the_runtime(tmp_path: Path) -> None:
    tokenizer_model(tmp_path / "tok")
    (tmp_path / "tok" / "config.pbtxt").unlink()  # the file alone tells the runtime
    assert detect_runtime(tmp_path / "tok" / "1") is TOKENIZER
    handle, _ = load_version(
        read_model_config(tmp_path / "tok"), 1, tmp_path / "tok" / "1", tmp_path / "tok", NoMetrics()
    )
    config = handle.config
    assert config.backend == "tokenizer"
    assert config.max_batch_size > 0
    assert [t.name for t in config.inputs] == ["TEXT"]
    assert [(t.name, t.dims) for t in config.outputs] == [
        ("input_ids", (-1,)),
        ("attention_mask", (-1,)),
        ("token_type_ids", (-1,)),
    ]
    handle.pool.close()


@pytest.mark.parametrize(("preset", "expected"), [(None, "false"), ("true", "true")])
def test_batches_tokenize_on_the_calling_thread_unless_the_environment_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str | None, expected: str
) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", preset or "")  # restored after the test, as it was
    if preset is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    runtime(tmp_path, "max_batch_size: 8")
    assert os.environ["TOKENIZERS_PARALLELISM"] == expected
