"""How a file's records are cut into shards and mini-batches (inferd.tools.batch.pieces) and how
records are kept (inferd.tools.batch.records.Records)."""

from __future__ import annotations

from inferd.tools.batch.pieces import Piece, PieceCutter, ShardEnd
from inferd.tools.batch.records import Records


def chunk(start: int, sizes: list[int]) -> Records:
    return Records(start, [b"x" * size for size in sizes], range(start + 1, start + 1 + len(sizes)))


def cut(cutter: PieceCutter, chunks: list[Records], total: int) -> list[Piece | ShardEnd]:
    items: list[Piece | ShardEnd] = []
    for part in chunks:
        items += cutter.add(part)
    items += cutter.end(total)
    return items


def shape(items: list[Piece | ShardEnd]) -> list[tuple[str, int, int, list[int]]]:
    return [
        ("piece", item.shard, item.seq, [r.index for r in item.records] + [-r.index for r in item.oversized])
        if isinstance(item, Piece)
        else ("end", item.shard, item.pieces, [])
        for item in items
    ]


def test_pieces_fill_to_the_batch_size_across_chunks_and_never_cross_a_shard() -> None:
    cutter = PieceCutter(0, frozenset(), shard_records=5, max_records=2, limit=None)
    items = cut(cutter, [chunk(0, [1] * 3), chunk(3, [1] * 4)], total=7)
    assert shape(items) == [
        ("piece", 0, 0, [0, 1]),
        ("piece", 0, 1, [2, 3]),
        ("piece", 0, 2, [4]),
        ("end", 0, 3, []),
        ("piece", 1, 0, [5, 6]),
        ("end", 1, 1, []),
    ]


def test_the_payload_bound_cuts_earlier_and_an_oversized_record_travels_as_an_error() -> None:
    cutter = PieceCutter(0, frozenset(), shard_records=100, max_records=10, limit=10)
    items = cut(cutter, [chunk(0, [4, 4, 4, 11, 2])], total=5)
    assert shape(items) == [("piece", 0, 0, [0, 1]), ("piece", 0, 1, [2, 4, -3]), ("end", 0, 2, [])]


def test_shards_done_by_an_earlier_run_yield_nothing_and_an_empty_file_is_one_empty_shard() -> None:
    cutter = PieceCutter(3, frozenset({0}), shard_records=2, max_records=8, limit=None)
    assert shape(cut(cutter, [chunk(0, [1] * 3)], total=3)) == [("piece", 1, 0, [2]), ("end", 1, 1, [])]
    assert cut(PieceCutter(3, frozenset(), 2, 8, None), [], total=0) == [ShardEnd(3, 0, 0)]
    assert cut(PieceCutter(3, frozenset({0}), 2, 8, None), [], total=0) == []


def test_records_are_made_only_when_looked_at() -> None:
    records = Records(10, [b"a", b"bb", b"ccc"], [3, 5, 6])
    assert len(records) == 3 and records.sizes == [1, 2, 3]
    middle = records[1:]
    assert middle.start == 11 and middle.raws == [b"bb", b"ccc"]
    record = middle[-1]
    assert (record.index, record.line, record.raw, record.size) == (12, 6, b"ccc", 3)
    joined = records[:1] + records[2:]
    assert [r.line for r in joined] == [3, 6]
    assert Records.of(list(records)).raws == records.raws


def test_an_input_name_that_would_write_outside_the_output_is_refused() -> None:
    import pytest

    from inferd.tools.batch.options import BatchUsageError
    from inferd.tools.batch.records import check_output_name

    check_output_name("data/part-0001.jsonl")
    for name in ("../escape.jsonl", "a/../../b", "a//b", "./a", "_parts/000000/00000000.part"):
        with pytest.raises(BatchUsageError, match="outside --output"):
            check_output_name(name)


def test_shard_spans_read_as_the_whole_file_reads(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import fsspec

    from inferd.tools.batch import records as module
    from inferd.tools.batch.options import BatchOptions
    from inferd.tools.batch.records import InputFile, read_records, read_shard, shard_spans

    monkeypatch.setattr(module, "READ_BYTES", 6)  # blocks that end inside a CR LF, a line, a record
    fs = fsspec.filesystem("file")
    cases = {
        "empty": b"",
        "blank": b"\n\n",
        "crlf": b"\r\n",
        "edges": b"[1]\r\n\r\n[2]\n[3]\n",
        "no final newline": b"[1]\n\n[2]\r\n[3]\n[4]\n[5]",
        "lone cr at the end": b"[1]\n[2]\n\r",
    }
    for name, data in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.jsonl"
        path.write_bytes(data)
        file = InputFile(str(path), path.name, len(data), "")
        options = BatchOptions("m", str(path), "out", shard_records=2)
        whole = [(r.index, r.line, r.raw) for chunk in read_records(fs, file, options) for r in chunk]
        assert all(raw and not raw.endswith(b"\r") for _, _, raw in whole), name
        spans, count = shard_spans(fs, file, options)
        assert count == len(whole), name
        by_shard = [[(r.index, r.line, r.raw) for r in read_shard(fs, file, options, span)] for span in spans]
        assert [record for shard in by_shard for record in shard] == whole, name
        assert all(len(shard) <= 2 for shard in by_shard), name


def test_an_output_folder_that_begins_with_a_prefix_input_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from inferd.tools.batch.store import same_location

    (tmp_path / "run-1.jsonl").write_bytes(b"[1]\n")
    assert same_location(str(tmp_path / "run"), str(tmp_path / "run-out"))  # a prefix: its listing
    assert not same_location(str(tmp_path / "run-1.jsonl"), str(tmp_path / "run-1.jsonl-out"))
    (tmp_path / "data").mkdir()
    assert not same_location(str(tmp_path / "data"), str(tmp_path / "data2"))  # a folder: only under it
    assert same_location(str(tmp_path / "data"), str(tmp_path / "data" / "out"))
