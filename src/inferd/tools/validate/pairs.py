"""Sentence pairs, as the published BF16 check used them: each model embeds both sentences of a
pair, the pair's score is the cosine similarity of the two embeddings, and a decision is the score
against a threshold. A model takes either text (one BYTES input: a served tokenizer → encoder
pipeline) or token ids (input_ids, attention_mask, token_type_ids), tokenized here with the
model's tokenizer.json. An embedding output with a sequence axis is mean-pooled over the mask."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferd.tools.validate.models import ModelUnderTest
from inferd.types import DataType

TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MAX_TOKENS = 512


@dataclass(frozen=True, slots=True)
class SentencePairs:
    first: list[str]
    second: list[str]
    labels: list[float] | None
    """A gold label per pair, when the file has a third column: 1 (alike) or 0, or a graded score
    (STS's 0 to 5), which the threshold binarizes as it does the models' scores."""

    @property
    def binary_labels(self) -> bool:
        return self.labels is not None and all(label in (0.0, 1.0) for label in self.labels)

    def gold(self, threshold: float) -> np.ndarray[Any, Any] | None:
        """Each pair's gold decision: a 0/1 label as it is, a graded one above the threshold."""
        if self.labels is None:
            return None
        labels = np.array(self.labels, dtype=np.float64)
        return labels == 1.0 if self.binary_labels else labels > threshold


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def read_pairs(path: Path) -> SentencePairs:
    """A TSV of `sentence_a<TAB>sentence_b[<TAB>label]`, with or without a header line; labels 0
    or 1, or graded scores (0 to 5, as STS's)."""
    if not path.is_file():
        raise ValueError(f"sentence pairs file '{path}' does not exist")
    with path.open(encoding="utf-8", newline="") as lines:
        rows = [row for row in csv.reader(lines, delimiter="\t") if row]
    if rows and len(rows[0]) == 3 and _number(rows[0][2]) is None:
        rows = rows[1:]  # the header
    if not rows or any(len(row) not in (2, 3) for row in rows):
        raise ValueError(f"'{path}' must hold lines of sentence_a<TAB>sentence_b[<TAB>label: 0 or 1, or a score]")
    labelled = [row for row in rows if len(row) == 3]
    if labelled and len(labelled) != len(rows):
        raise ValueError(f"'{path}': some pairs have a label and some do not: label every pair or none")
    numbers = [_number(row[2]) for row in labelled]
    unread = [index + 1 for index, number in enumerate(numbers) if number is None]
    if unread:
        raise ValueError(f"'{path}': pair {unread[0]}'s label {labelled[unread[0] - 1][2]!r} is not a number")
    labels = [n for n in numbers if n is not None] if labelled else None
    return SentencePairs([row[0] for row in rows], [row[1] for row in rows], labels)


class Embedder:
    """One model's sentence embeddings."""

    def __init__(self, model: ModelUnderTest, tokenizer: Path | None, embedding: str | None) -> None:
        self._model = model
        inputs = {t.name: t for t in model.metadata.inputs}
        outputs = [t.name for t in model.metadata.outputs]
        self._text_input = (
            next(iter(inputs)) if len(inputs) == 1 and next(iter(inputs.values())).datatype == "BYTES" else None
        )
        if self._text_input is None:
            missing = [name for name in inputs if name not in TOKEN_INPUTS]
            if missing or "input_ids" not in inputs:
                raise ValueError(
                    f"model '{model.name}' takes {sorted(inputs)}: sentence pairs need one BYTES text input or "
                    f"token inputs ({', '.join(TOKEN_INPUTS)})"
                )
            if tokenizer is None:
                raise ValueError(f"model '{model.name}' takes token ids: give its tokenizer.json with --tokenizer")
            self._tokenizer = load_tokenizer(tokenizer)
        self._token_inputs = [name for name in TOKEN_INPUTS if name in inputs]
        floats = [t.name for t in model.metadata.outputs if t.datatype in ("FP32", "FP16", "BF16", "FP64")]
        self.output = embedding or ("sentence_embedding" if "sentence_embedding" in outputs else (floats or outputs)[0])
        if self.output not in outputs:
            raise ValueError(f"model '{model.name}' has no output '{self.output}'; its outputs are {outputs}")

    def embed(self, sentence: str) -> np.ndarray[Any, Any]:
        batched = self._model.max_batch_size > 0
        if self._text_input is not None:
            text = np.array([sentence.encode("utf-8")], dtype=object).reshape((1, 1) if batched else (1,))
            vector = self._model.run({self._text_input: text}, [self.output])[self.output]
            return np.asarray(vector, dtype=np.float64).reshape(-1)
        inputs = tokenize(self._tokenizer, sentence, self._token_inputs)
        output = np.asarray(self._model.run(inputs, [self.output])[self.output], dtype=np.float64)
        if output.ndim == 3:  # [1, tokens, dims]: mean over the tokens the mask keeps
            mask = np.asarray(self._tokenizer.encode(sentence).attention_mask, dtype=np.float64)[None, :, None]
            output = (output * mask).sum(axis=1) / max(mask.sum(), 1.0)
        return output.reshape(-1)


def load_tokenizer(path: Path) -> Any:
    """A Hugging Face tokenizer.json, truncating at the longest input a BERT-class model takes."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(MAX_TOKENS)
    return tokenizer


def tokenize(tokenizer: Any, sentence: str, names: list[str]) -> dict[str, np.ndarray[Any, Any]]:
    """One sentence as a batch of one: the token inputs `names` (of TOKEN_INPUTS) as INT64."""
    encoding = tokenizer.encode(sentence)
    columns = {
        "input_ids": encoding.ids,
        "attention_mask": encoding.attention_mask,
        "token_type_ids": encoding.type_ids,
    }
    return {name: np.array([columns[name]], dtype=DataType.INT64.numpy_dtype) for name in names}


def similarities(embedder: Embedder, pairs: SentencePairs) -> tuple[np.ndarray[Any, Any], list[np.ndarray[Any, Any]]]:
    """Each pair's cosine similarity, and every sentence's embedding (first sentences, then second)."""
    first = [embedder.embed(s) for s in pairs.first]
    second = [embedder.embed(s) for s in pairs.second]
    scores = np.array(
        [
            float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))
            for a, b in zip(first, second, strict=True)
        ]
    )
    return scores, first + second
