"""Byte sizes as people write them: 4GiB, 512MiB, 1.5GB or 1000000 (bytes)."""

from __future__ import annotations

_UNITS: dict[str, int] = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip


def parse_size(text: str) -> float:
    """The bytes `text` says (a float: the caller decides what rounds to 0); ValueError when it
    is not a size."""
    cleaned = text.strip().lower().replace(" ", "")
    number = cleaned.rstrip("kmgtib")
    unit = cleaned[len(number) :]
    if unit not in _UNITS:
        raise ValueError(f"'{text}' is not a size such as 4GiB, 512MiB or 1000000")
    try:
        return float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"'{text}' is not a size such as 4GiB, 512MiB or 1000000") from None
