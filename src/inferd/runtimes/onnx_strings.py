"""BYTES elements ⇄ the Python `str` that ONNX Runtime's string tensors take, without loss.

ONNX Runtime keeps a string element as arbitrary bytes, but its Python API takes and returns only
`str`, converted through strict UTF-8 both ways. So bytes that are not UTF-8 (an image, a serialized
proto) cannot pass as they are, and Python's `surrogateescape` does not help: ORT's encoder refuses
the lone surrogates it makes. Triton hands such bytes to the model unchanged; inferd gets the same
round trip with an escape that ORT accepts:

* valid UTF-8 is decoded as it is, so a model that reads text sees the text;
* each byte of an invalid sequence (always 0x80-0xFF) becomes the code point ESCAPE_BASE + byte,
  in the last 128 code points of plane 16 (private use, so no text assigns them a meaning);
* a character that is itself in that range is escaped byte by byte too, so the mapping is one to
  one and `bytes_from_ort` reverses it exactly.

The only strings that do not survive are escape-range characters that a model writes itself,
which come back as raw bytes.
"""

from __future__ import annotations

ESCAPE_BASE = 0x10FF00
_FIRST_ESCAPE = ESCAPE_BASE + 0x80
_LAST_CODE_POINT = 0x10FFFF
# Python's surrogateescape stands each undecodable byte b for U+DC00 + b.
_SURROGATE_BASE = 0xDC00

_ESCAPE_INVALID: dict[int, str] = {_SURROGATE_BASE + b: chr(ESCAPE_BASE + b) for b in range(0x80, 0x100)}
_ESCAPE_INVALID.update(
    {
        code_point: "".join(chr(ESCAPE_BASE + b) for b in chr(code_point).encode("utf-8"))
        for code_point in range(_FIRST_ESCAPE, _LAST_CODE_POINT + 1)
    }
)
_UNESCAPE: dict[int, int] = {ESCAPE_BASE + b: _SURROGATE_BASE + b for b in range(0x80, 0x100)}


def str_for_ort(element: bytes) -> str:
    """`element` as the str ORT takes: its UTF-8 text, with the escapes above where it is not."""
    try:
        text = element.decode("utf-8")
    except UnicodeDecodeError:
        return element.decode("utf-8", "surrogateescape").translate(_ESCAPE_INVALID)
    if text.isascii() or max(text) < chr(_FIRST_ESCAPE):
        return text
    return text.translate(_ESCAPE_INVALID)


def bytes_from_ort(text: str) -> bytes:
    """The inverse of `str_for_ort`."""
    if text.isascii() or max(text) < chr(_FIRST_ESCAPE):
        return text.encode("utf-8")
    return text.translate(_UNESCAPE).encode("utf-8", "surrogateescape")
