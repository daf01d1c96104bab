"""When an ONNX Runtime CPU session gives its arena back: after a burst, on the first small
execution, at most once an interval; never while large executions go on."""

from __future__ import annotations

from inferd.runtimes.onnx import ArenaShrink
from inferd.testing.fakes import FakeClock

MIB = 1 << 20


def test_sustained_large_executions_keep_the_arena() -> None:
    clock = FakeClock()
    arena = ArenaShrink(interval_s=10, clock=clock)
    for _ in range(100):
        clock.advance(1)
        assert not arena.after(32 * MIB)


def test_the_first_small_execution_after_a_burst_shrinks_once() -> None:
    clock = FakeClock()
    arena = ArenaShrink(interval_s=10, clock=clock)
    clock.advance(60)
    assert not arena.after(1 * MIB)
    assert not arena.after(32 * MIB)  # the burst
    assert not arena.after(9 * MIB)  # more than a quarter of it
    assert arena.after(1 * MIB)  # a quarter or less: shrink
    assert not arena.after(1 * MIB)  # and not again for small ones: the largest is now this one


def test_shrinks_are_an_interval_apart() -> None:
    clock = FakeClock()
    arena = ArenaShrink(interval_s=10, clock=clock)
    clock.advance(60)
    assert not arena.after(32 * MIB)
    assert arena.after(MIB)
    assert not arena.after(32 * MIB)
    clock.advance(9)
    assert not arena.after(MIB)  # too soon
    clock.advance(1)
    assert arena.after(MIB)
