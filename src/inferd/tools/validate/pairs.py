"""Sentence pairs, as the published BF16 check used them: a pair's score, and a decision, the score
against a threshold. Two kinds of model score a pair:

* a bi-encoder embeds each sentence, and the pair's score is the cosine similarity of the two
  embeddings (MiniLM's). It takes either text (one BYTES input: a served tokenizer → encoder
  pipeline) or token ids (input_ids, attention_mask, token_type_ids), tokenized here with the
  model's tokenizer.json. An embedding output with a sequence axis is mean-pooled over the mask.
* a cross-encoder reads both sentences at once and answers the score itself (one value a pair,
  a logit unless its graph ends in a sigmoid): two BYTES inputs (the pair's texts, the first
  sentence to the first input the metadata lists), or token ids
  of the pair encoded together as its tokenizer does (`[CLS] a [SEP] b [SEP]`, token types 0
  then 1).

Which kind a model is follows from it: two text inputs, or a scored output of one value a row, make
a cross-encoder; `PairScorer` is the one thing validate asks of either."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

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


PairModel = Literal["auto", "bi-encoder", "cross-encoder"]
Activation = Literal["none", "sigmoid"]


class PairScorer(Protocol):
    output: str
    """The output read (an embedding, or a cross-encoder's score)."""

    def score(self, pairs: SentencePairs) -> tuple[np.ndarray[Any, Any], list[np.ndarray[Any, Any]] | None]:
        """Each pair's score, and the vectors behind them when there are (embeddings, first
        sentences then second), else None."""
        ...


def pair_scorer(
    model: ModelUnderTest, tokenizer: Path | None, output: str | None, kind: PairModel = "auto",
    activation: Activation = "none",
) -> PairScorer:  # fmt: skip
    """The scorer for `model`: `kind`, or the kind the model's inputs and output say it is: two text
    inputs, or an output of a known one value a row ([batch, 1]), make a cross-encoder. Anything
    else embeds; an embedding of one value is refused then, naming --pair-model (a shape that is
    unknown, or [batch], says neither)."""
    texts = [t.name for t in model.metadata.inputs if t.datatype == "BYTES"]
    if kind == "auto":
        chosen = _read_output(model, output)
        shape = next(t.shape for t in model.metadata.outputs if t.name == chosen)
        one_a_row = len(shape) == 2 and shape[1] == 1
        kind = "cross-encoder" if len(texts) == 2 or (not texts and one_a_row) else "bi-encoder"
    if kind == "cross-encoder":
        return CrossEncoder(model, tokenizer, output, activation)
    return Embedder(model, tokenizer, output)


def _read_output(model: ModelUnderTest, output: str | None) -> str:
    """The output named, else `sentence_embedding`, else the first floating-point one."""
    outputs = [t.name for t in model.metadata.outputs]
    floats = [t.name for t in model.metadata.outputs if t.datatype in ("FP32", "FP16", "BF16", "FP64")]
    chosen = output or ("sentence_embedding" if "sentence_embedding" in outputs else (floats or outputs)[0])
    if chosen not in outputs:
        raise ValueError(f"model '{model.name}' has no output '{chosen}'; its outputs are {outputs}")
    return chosen


def _token_inputs(model: ModelUnderTest, tokenizer: Path | None, texts: int) -> tuple[str | None, list[str], Any]:
    """How the model takes a sentence: (its text input, None) when it takes `texts` BYTES inputs, else
    its token inputs and the tokenizer that makes them."""
    inputs = {t.name: t for t in model.metadata.inputs}
    if len(inputs) == texts and all(t.datatype == "BYTES" for t in inputs.values()):
        return next(iter(inputs)), [], None
    missing = [name for name in inputs if name not in TOKEN_INPUTS]
    if missing or "input_ids" not in inputs:
        said = "one BYTES text input" if texts == 1 else "two BYTES inputs (the pair's texts)"
        raise ValueError(
            f"model '{model.name}' takes {sorted(inputs)}: sentence pairs need {said} or token inputs "
            f"({', '.join(TOKEN_INPUTS)})"
        )
    if tokenizer is None:
        raise ValueError(f"model '{model.name}' takes token ids: give its tokenizer.json with --tokenizer")
    return None, [name for name in TOKEN_INPUTS if name in inputs], load_tokenizer(tokenizer)


class CrossEncoder:
    """One model's score of each pair, both sentences read at once."""

    def __init__(
        self, model: ModelUnderTest, tokenizer: Path | None, output: str | None, activation: Activation
    ) -> None:
        self._model = model
        self._activation = activation
        self.output = _read_output(model, output)
        text, self._token_inputs, self._tokenizer = _token_inputs(model, tokenizer, texts=2)
        self._texts = [t.name for t in model.metadata.inputs] if text is not None else []

    def score(self, pairs: SentencePairs) -> tuple[np.ndarray[Any, Any], None]:
        scores = np.array([self._pair(a, b) for a, b in zip(pairs.first, pairs.second, strict=True)])
        return (1.0 / (1.0 + np.exp(-scores)) if self._activation == "sigmoid" else scores), None

    def _pair(self, first: str, second: str) -> float:
        if self._texts:
            feed = texts_feed(self._model, self._texts, [first, second])
        else:
            feed = tokenize(self._tokenizer, first, self._token_inputs, second)
        value = np.asarray(self._model.run(feed, [self.output])[self.output], dtype=np.float64)
        if value.size != 1:
            raise ValueError(
                f"model '{self._model.name}' answered {value.size} values in '{self.output}' for one pair: a "
                "cross-encoder's score is one (name the output with --embedding, or --pair-model bi-encoder)"
            )
        return float(value.reshape(()))


class Embedder:
    """One model's sentence embeddings; a pair's score is their cosine."""

    def __init__(self, model: ModelUnderTest, tokenizer: Path | None, embedding: str | None) -> None:
        self._model = model
        self.output = _read_output(model, embedding)
        self._text_input, self._token_inputs, self._tokenizer = _token_inputs(model, tokenizer, texts=1)

    def score(self, pairs: SentencePairs) -> tuple[np.ndarray[Any, Any], list[np.ndarray[Any, Any]]]:
        return similarities(self, pairs)

    def embed(self, sentence: str) -> np.ndarray[Any, Any]:
        if self._text_input is not None:
            feed = texts_feed(self._model, [self._text_input], [sentence])
            vector = np.asarray(self._model.run(feed, [self.output])[self.output], dtype=np.float64).reshape(-1)
        else:
            inputs = tokenize(self._tokenizer, sentence, self._token_inputs)
            output = np.asarray(self._model.run(inputs, [self.output])[self.output], dtype=np.float64)
            if output.ndim == 3:  # [1, tokens, dims]: mean over the tokens the mask keeps
                mask = np.asarray(self._tokenizer.encode(sentence).attention_mask, dtype=np.float64)[None, :, None]
                output = (output * mask).sum(axis=1) / max(mask.sum(), 1.0)
            vector = output.reshape(-1)
        if vector.size == 1:  # the cosine of one-value vectors is +-1: nothing would be judged
            raise ValueError(
                f"model '{self._model.name}' answered one value for a sentence in '{self.output}': that is no "
                "embedding; a model that scores a pair is a cross-encoder (--pair-model cross-encoder)"
            )
        return vector


def texts_feed(model: ModelUnderTest, names: list[str], texts: list[str]) -> dict[str, np.ndarray[Any, Any]]:
    """Each text as a batch of one to the BYTES input of the same place in `names`."""
    shape = (1, 1) if model.max_batch_size > 0 else (1,)
    return {
        name: np.array([text.encode("utf-8")], dtype=object).reshape(shape)
        for name, text in zip(names, texts, strict=True)
    }


def load_tokenizer(path: Path) -> Any:
    """A Hugging Face tokenizer.json, truncating at the longest input a BERT-class model takes."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(MAX_TOKENS)
    return tokenizer


def tokenize(
    tokenizer: Any, sentence: str, names: list[str], second: str | None = None
) -> dict[str, np.ndarray[Any, Any]]:
    """One sentence (or a pair, encoded together) as a batch of one: the token inputs `names` (of
    TOKEN_INPUTS) as INT64."""
    encoding = tokenizer.encode(sentence) if second is None else tokenizer.encode(sentence, second)
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
