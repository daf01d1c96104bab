"""The CPU's description (runtimes.base): the ONNX cache's entries are keyed by it, so it must read
/proc/cpuinfo exactly as the cache always did (or every cache would miss after an upgrade); and
whether the CPU computes bfloat16."""

from __future__ import annotations

import pytest

from inferd.runtimes.base import describe_cpu

X86 = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512_bf16\nprocessor\t: 1\nflags\t\t: fpu sse avx2 avx512_bf16\n"


def described_before(cpuinfo: str) -> str:
    """What the cache's key hashed before the description moved to runtimes.base (its own copy)."""
    fields = [(n.strip().lower(), v.strip()) for n, v in (line.split(":", 1) for line in cpuinfo.splitlines(True)
                                                           if ":" in line)]  # fmt: skip
    flags = next((v for n, v in fields if n in ("flags", "features")), None)
    if flags is not None:
        return " ".join(sorted(flags.split()))
    return " ".join(sorted({v for n, v in fields if n in ("cpu", "model name")}))


@pytest.mark.parametrize(
    "cpuinfo",
    [
        X86,
        "processor\t: 0\nFeatures\t: fp asimd bf16 sve\n",  # arm64
        "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdc\nuarch\t\t: sifive,u74-mc\n",  # RISC-V: no line it reads
        "processor\t: 0\nflags\t\t:\n",  # empty flags
        "flags\t\t: sse sse avx\n",  # a flag twice
        "processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\nclock\t\t: 2166.000000MHz\n",  # ppc64le
    ],
)
def test_the_description_is_what_the_onnx_cache_always_hashed(cpuinfo: str) -> None:
    _, names = describe_cpu(cpuinfo)
    assert " ".join(names) == described_before(cpuinfo)


def test_bfloat16_arithmetic_is_read_from_the_flags() -> None:
    assert "avx512_bf16" in describe_cpu(X86)[1]
    assert describe_cpu("processor\t: 0\ncpu\t\t: POWER9\n")[0] == "model"
