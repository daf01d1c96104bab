"""A function run in a fresh process, for libraries that must not share the test run's process.

TensorFlow bundles its own C++ libraries (abseil, protobuf): once its runtime has run in a process,
OR-Tools' CP-SAT solver, whose own copies differ, crashes that process with a segmentation fault
(seen running the plan solver's unit tests after the SavedModel runtime's). Servers never hold both
(`inferd plan` solves in a process of its own, and a server never imports OR-Tools); the tests'
process would, so what runs TensorFlow in a test runs here."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Result = TypeVar("Result")
CHILD_TIMEOUT_S = 300.0


def in_child(function: Callable[..., Result], /, *args: Any, **kwargs: Any) -> Result:
    """`function(*args, **kwargs)` in a fresh (spawned) process: its result, or its exception
    (an AssertionError of a check included), as if it ran here. The function, its arguments and
    its result must pickle (a module-level function, paths, numpy arrays)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args, **kwargs).result(timeout=CHILD_TIMEOUT_S)
