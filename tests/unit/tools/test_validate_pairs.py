"""Sentence pairs files and the decisions their labels give (inferd.tools.validate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd.tools.validate.pairs import read_pairs
from inferd.tools.validate.run import f1_score


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
