"""SageMaker's data processing paths (inferd.tools.batch.filters) and the knobs' checks."""

from __future__ import annotations

import pytest

from inferd.tools.batch.filters import FilterError, JsonFilter, join
from inferd.tools.batch.options import BatchOptions, BatchUsageError, Format, JoinSource, SplitType, format_of

RECORD = {"id": 7, "features": [1, 2, 3], "SageMakerOutput": {"p": 0.5}, "account_id": "a"}


@pytest.mark.parametrize(
    ("path", "value", "selected"),
    [
        ("$", RECORD, RECORD),
        ("$.features", RECORD, [1, 2, 3]),
        ("$.features[1:]", RECORD, [2, 3]),
        ("$['id','SageMakerOutput']", RECORD, {"id": 7, "SageMakerOutput": {"p": 0.5}}),
        ("$['account_id']", RECORD, "a"),  # underscores, which SageMaker's service refuses
        ("$[1:]", [0, 1, 2, 3], [1, 2, 3]),
        ("$[0,-1]", [0, 1, 2, 3], [0, 3]),
        ("$[0,2:]", [0, 1, 2, 3], [0, 2, 3]),  # an index and a range in one union
        ("$[:2]", [0, 1, 2, 3], [0, 1]),  # a slice ends before its end index (RFC 9535)
        ("$[0]", [0, 1, 2, 3], 0),
    ],
)
def test_a_path_selects_a_value_an_object_of_names_or_a_list(path: str, value: object, selected: object) -> None:
    assert JsonFilter.compile(path, "--input-filter").apply(value) == selected


def test_a_path_to_one_node_that_finds_none_is_the_records_error() -> None:
    with pytest.raises(FilterError, match=r"\$.missing"):
        JsonFilter.compile("$.missing", "--input-filter").apply(RECORD)


def test_a_path_that_is_no_jsonpath_is_a_usage_error() -> None:
    with pytest.raises(BatchUsageError, match="--output-filter"):
        JsonFilter.compile("$[", "--output-filter")


def test_join_as_sagemaker_joins() -> None:
    assert join({"a": 1}, [0.5]) == {"a": 1, "SageMakerOutput": [0.5]}
    assert join([1, 2], [0.5]) == {"SageMakerInput": [1, 2], "SageMakerOutput": [0.5]}


def test_content_types_and_split_defaults() -> None:
    assert format_of("application/jsonlines") is Format.JSON_LINES
    assert format_of("text/csv; charset=utf-8") is Format.CSV
    assert format_of("image/jpeg") is Format.RAW
    with pytest.raises(BatchUsageError):
        format_of("jsonl")
    assert BatchOptions("m", "in", "out").split is SplitType.LINE
    assert BatchOptions("m", "in", "out", content_type="application/json").split is SplitType.NONE
    assert BatchOptions("m", "in", "out", content_type="image/png").split is SplitType.NONE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"content_type": "application/x-npy", "split_type": SplitType.LINE}, "its rows"),
        ({"split_type": SplitType.NONE}, "split by line"),
        ({"content_type": "image/png", "join_source": JoinSource.INPUT}, "JSON and CSV"),
        ({"columns": {"a": "x"}}, "Parquet"),
        ({"max_concurrent_transforms": 0}, "at least 1"),
        ({"max_error_rate": 2.0}, "between 0 and 1"),
    ],
)
def test_knobs_that_cannot_go_together(change: dict[str, object], message: str) -> None:
    with pytest.raises(BatchUsageError, match=message):
        BatchOptions("m", "in", "out", **change).check()  # type: ignore[arg-type]


def test_identity_leaves_out_how_the_job_runs() -> None:
    base = BatchOptions("m", "in", "out")
    assert base.identity() == BatchOptions("m", "in", "out", max_concurrent_transforms=9, max_error_rate=0.5).identity()
    assert base.identity() != BatchOptions("m", "in", "out", input_filter="$.x").identity()
