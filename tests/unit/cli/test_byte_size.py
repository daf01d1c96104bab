"""Sizes on the command line (--model-memory-budget, --onnx-cache-size, ...)."""

from __future__ import annotations

import click
import pytest

from inferd.cli.serve import ByteSize


@pytest.mark.parametrize(
    ("text", "size"),
    [("4GiB", 4 << 30), ("512 MiB", 512 << 20), ("1.5GB", 1_500_000_000), ("1000", 1000), ("10gib", 10 << 30)],
)
def test_sizes_read_as_people_write_them(text: str, size: int) -> None:
    assert ByteSize().convert(text, None, None) == size


def test_zero_is_a_size_only_where_it_means_off() -> None:
    assert ByteSize(allow_zero=True).convert("0", None, None) == 0
    with pytest.raises(click.BadParameter, match="more than 0 bytes"):
        ByteSize().convert("0", None, None)
    for below_a_byte in ("-1GiB", "0.4"):  # never taken for "off"
        with pytest.raises(click.BadParameter, match="0 \\(off\\) or at least 1 byte"):
            ByteSize(allow_zero=True).convert(below_a_byte, None, None)


def test_what_is_not_a_size_says_what_is() -> None:
    with pytest.raises(click.BadParameter, match="not a size such as 4GiB"):
        ByteSize().convert("lots", None, None)
