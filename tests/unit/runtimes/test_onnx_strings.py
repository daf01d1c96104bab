"""The BYTES ⇄ ORT string escape: any bytes survive, and text stays text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inferd.runtimes.onnx_strings import ESCAPE_BASE, bytes_from_ort, str_for_ort


@given(st.binary(max_size=64))
def test_any_bytes_round_trip_through_a_str_that_utf8_can_encode(element: bytes) -> None:
    text = str_for_ort(element)
    text.encode("utf-8")  # what ORT does with it: must not raise
    assert bytes_from_ort(text) == element


@given(st.text(max_size=64))
def test_text_is_seen_as_itself(text: str) -> None:
    # Text outside the escape range (all text in practice) reaches the model unchanged.
    text = "".join(c for c in text if ord(c) < ESCAPE_BASE + 0x80 and not 0xD800 <= ord(c) < 0xE000)
    assert str_for_ort(text.encode("utf-8")) == text


def test_invalid_bytes_become_escape_characters() -> None:
    assert str_for_ort(b"ok\xff") == "ok" + chr(ESCAPE_BASE + 0xFF)
    # A character inside the escape range is escaped byte by byte, so the mapping stays one to one.
    assert str_for_ort("\U0010ffff".encode()) == "".join(chr(ESCAPE_BASE + b) for b in "\U0010ffff".encode())
