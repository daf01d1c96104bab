"""Sentence pairs files, the decisions their labels give, and how each kind of model scores a pair
(inferd.tools.validate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd.tools.validate.pairs import CrossEncoder, Embedder, SentencePairs, pair_scorer, read_pairs
from inferd.tools.validate.run import f1_score
from inferd.types import ModelMetadata, TensorMetadata


def test_binary_labels_are_the_gold_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text("a\tb\tlabel\nx\ty\t1\nz\tw\t0\n")
    pairs = read_pairs(path)
    assert pairs.labels == [1.0, 0.0] and pairs.binary_labels
    assert pairs.gold(3.0).tolist() == [True, False]  # a 0/1 label is not a score to binarize


def test_graded_labels_are_binarized_at_the_threshold(tmp_path: Path) -> None:
    path = tmp_path / "sts.tsv"
    path.write_text("x\ty\t4.6\nz\tw\t3.0\nq\tr\t0.2\n")  # no header
    pairs = read_pairs(path)
    assert pairs.labels == [4.6, 3.0, 0.2] and not pairs.binary_labels
    assert pairs.gold(3.0).tolist() == [True, False, False]  # above it, as the models' decisions


def test_unlabelled_pairs_have_no_gold(tmp_path: Path) -> None:
    path = tmp_path / "plain.tsv"
    path.write_text("x\ty\nz\tw\n")
    assert read_pairs(path).gold(0.5) is None


@pytest.mark.parametrize(
    ("decisions", "gold", "f1"),
    [
        ([True, True, False, False], [True, False, False, True], 0.5),
        ([True, False], [True, False], 1.0),
        ([False, False], [False, False], 0.0),  # no positive anywhere
    ],
)
def test_f1_of_decisions_against_gold(decisions: list[bool], gold: list[bool], f1: float) -> None:
    assert f1_score(np.array(decisions), np.array(gold)) == pytest.approx(f1)


@pytest.mark.parametrize(
    ("text", "said"),
    [("x\ty\t1\nz\tw\tNA\n", "pair 2's label 'NA' is not a number"), ("x\ty\t1\nz\tw\tnan\n", "is not a number"),
     ("x\ty\t1\nz\tw\n", "label every pair or none")],
)  # fmt: skip
def test_a_label_that_is_not_a_number_is_refused_naming_the_pair(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text(text)
    with pytest.raises(ValueError, match=said):
        read_pairs(path)


class PairModel:
    """A cross-encoder that answers, for each pair, the number of tokens of the second sentence (the
    ones of token type 1), so that reading the pair encoded together is what gives the score."""

    name = "fake"
    max_batch_size = 8

    def __init__(self, inputs: list[tuple[str, str]], output_shape: tuple[int, ...] = (-1, 1)) -> None:
        self.metadata = ModelMetadata(
            "fake", ("1",), "",
            tuple(TensorMetadata(name, datatype, (-1, -1)) for name, datatype in inputs),
            (TensorMetadata("logits", "FP32", output_shape),),
        )  # fmt: skip
        self.fed: list[dict[str, np.ndarray]] = []

    def run(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        self.fed.append(inputs)
        if "token_type_ids" in inputs:
            return {"logits": np.array([[float(inputs["token_type_ids"].sum())]], np.float32)}
        first, second = (inputs[name].reshape(-1)[0] for name in inputs)
        return {"logits": np.array([[len(first) - len(second)]], np.float32)}

    def close(self) -> None:
        pass


TOKENS = [("input_ids", "INT64"), ("attention_mask", "INT64"), ("token_type_ids", "INT64")]


def test_a_cross_encoder_reads_each_pair_encoded_together(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = minilm_tokenizer()
    pairs = SentencePairs(["a cat sat", "hello"], ["on the mat today", "world"], None)
    model = PairModel(TOKENS)
    scorer = pair_scorer(model, tokenizer, None)  # auto: one value a row
    assert isinstance(scorer, CrossEncoder)
    scores, vectors = scorer.score(pairs)
    assert vectors is None
    encoder = Tokenizer.from_file(str(tokenizer))
    pair = encoder.encode("a cat sat", "on the mat today")
    assert model.fed[0]["input_ids"].tolist() == [pair.ids]
    assert model.fed[0]["token_type_ids"].tolist() == [pair.type_ids]
    second_tokens = [sum(encoder.encode(a, b).type_ids) for a, b in zip(pairs.first, pairs.second, strict=True)]
    assert scores.tolist() == second_tokens and second_tokens[0] == 5  # "on the mat today" [SEP]

    sigmoid = pair_scorer(PairModel(TOKENS), tokenizer, None, activation="sigmoid").score(pairs)[0]
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-np.array(second_tokens, np.float64))))


def test_two_text_inputs_are_a_cross_encoder_and_one_embedding_output_a_bi_encoder(tmp_path: Path) -> None:
    texts = PairModel([("first", "BYTES"), ("second", "BYTES")])
    scores, _ = pair_scorer(texts, None, None).score(SentencePairs(["abcd"], ["ab"], None))
    assert scores.tolist() == [2.0] and texts.fed[0]["first"].tolist() == [[b"abcd"]]
    embedder = PairModel(TOKENS, output_shape=(-1, 384))
    assert isinstance(pair_scorer(embedder, minilm_tokenizer(), None), Embedder)
    # Named, whatever the output: a cross-encoder must answer one value a pair.
    forced = pair_scorer(embedder, minilm_tokenizer(), None, "cross-encoder")
    embedder.run = lambda inputs, outputs: {"logits": np.zeros((1, 384), np.float32)}  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="answered 384 values in 'logits' for one pair"):
        forced.score(SentencePairs(["a"], ["b"], None))


def minilm_tokenizer() -> Path:
    from inferd.testing.models import minilm_files

    return minilm_files() / "tokenizer.json"


def test_an_output_of_unknown_or_batch_only_shape_embeds_and_one_value_is_refused_as_an_embedding() -> None:
    """[batch] or an unknown shape says neither form: auto embeds; a model that then answers one
    value a sentence is refused, naming --pair-model, rather than judged by cosines of +-1."""
    for shape in ((-1,), ()):
        model = PairModel(TOKENS, output_shape=shape)
        scorer = pair_scorer(model, minilm_tokenizer(), None)
        assert isinstance(scorer, Embedder)
        with pytest.raises(ValueError, match=r"answered one value for a sentence .*--pair-model cross-encoder"):
            scorer.score(SentencePairs(["a"], ["b"], None))
