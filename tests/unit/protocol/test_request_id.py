"""Request ids: control characters refused; any other id written into a header safely and reversibly."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferd.errors import MalformedRequestError
from inferd.protocol.request_id import check_request_id, header_value


@given(st.text())
def test_header_value_is_printable_ascii_and_decodes_to_the_id(text: str) -> None:
    value = header_value(text)
    assert value.isascii() and value.isprintable()
    assert value == value.strip()  # nothing for a header parser to trim
    assert urllib.parse.unquote(value, errors="strict") == text


def test_plain_ids_are_written_as_they_are() -> None:
    assert header_value("trace-abc-123") == "trace-abc-123"
    assert header_value("a b") == "a b"
    assert header_value("lone \ud800") == "lone %ED%A0%80"  # no exception, whatever it is given


@pytest.mark.parametrize("value", ["a\r\nSet-Cookie: x=1", "tab\there", "nul\x00", "del\x7f", "c1\x85"])
def test_control_characters_are_refused(value: str) -> None:
    with pytest.raises(MalformedRequestError, match="control characters"):
        check_request_id(value, "'id'")


@pytest.mark.parametrize("value", ["", "résumé ✓", "日本", "50%"])
def test_printable_ids_pass(value: str) -> None:
    assert check_request_id(value, "'id'") == value
