"""ONNX Runtime's execution errors as inferd's: whose fault, and in words without ORT's insides.

ORT reports a kernel's failure as `[ONNXRuntimeError] : <code> : <NAME> : Non-zero status code
returned while running <Op> node. Name:'<node>' Status Message: <location> <check> was false.
<explanation>`, where <location> is a path into ORT's own sources (`/onnxruntime_src/...h:583`).
A kernel that fails on shapes (a broadcast that does not fit, indices out of a table, a reshape of
the wrong size) failed on this request's inputs: a model whose graph fixes a size the inputs
exceed (MiniLM's 512 position embeddings, given 600 tokens) is the common case, and that is a 400
naming the size. Any other failure is the server's (500). Clients never see ORT's source paths;
the server's log keeps the whole message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from inferd.errors import InferdError, InternalError, InvalidRequestError

# A location in ORT's sources, and the C++ check that failed there (up to "was false.").
_SOURCE_LOCATION = re.compile(r"(?:[A-Za-z]:)?[^\s:]*[/\\]onnxruntime[/\\][^\s:]+:\d+\s(?:[^\n]*?\bwas false\.\s*)?")
_NODE_FAILURE = re.compile(
    r"while running (?P<op>\w+) node\. Name:'(?P<node>[^']*)' Status Message: (?P<status>.*)", re.S
)
_SHAPE_WORDS = re.compile(r"broadcast|dimension|shape|out of (?:data )?bounds|indices|rank", re.I)
# BroadcastIterator's words for two sizes that cannot meet: "... a dimension other than 1. 512 by 600".
_BROADCAST_SIZES = re.compile(r"dimension other than 1\. (\d+) by (\d+)")


def without_source_locations(message: str) -> str:
    """ORT's message with its source paths (and the C++ checks that failed there) taken out."""
    return _SOURCE_LOCATION.sub("", message).strip()


def execution_error(model: str, exc: Exception, inputs: Mapping[str, np.ndarray[Any, Any]], *,
                    invalid_argument: bool) -> InferdError:  # fmt: skip
    """The error a failed `InferenceSession.run` answers: `invalid_argument` when ORT itself
    called the inputs invalid (INVALID_ARGUMENT)."""
    full = str(exc).strip()
    shown = without_source_locations(full)
    failure = _NODE_FAILURE.search(shown)
    shapes = ", ".join(f"'{name}' {list(array.shape)}" for name, array in inputs.items())
    if failure is not None and (invalid_argument or _SHAPE_WORDS.search(failure["status"])):
        node = f" '{failure['node']}'" if failure["node"] else ""
        return InvalidRequestError(
            f"model '{model}' cannot run on these inputs ({shapes}): its {failure['op']} node{node} failed: "
            f"{failure['status'].strip()}{_limit(failure['status'], inputs)}",
            server_message=f"model '{model}' cannot run on these inputs ({shapes}): {full}",
        )
    if invalid_argument:
        return InvalidRequestError(f"the model rejected the inputs: {shown}", server_message=full)
    return InternalError(f"onnxruntime failed: {shown}", server_message=f"onnxruntime failed: {full}")


def _limit(status: str, inputs: Mapping[str, np.ndarray[Any, Any]]) -> str:
    """Which of two sizes that could not be broadcast is the model's: the one no input has."""
    sizes = _BROADCAST_SIZES.search(status)
    if sizes is None:
        return ""
    first, second = int(sizes[1]), int(sizes[2])
    given = {d for array in inputs.values() for d in array.shape}
    if (first in given) == (second in given):
        return ""
    limit, size = (second, first) if first in given else (first, second)
    return (
        f" (a size of {size} from the inputs met a size of {limit} fixed in the model's graph: the model takes "
        f"at most {limit} there, such as its longest sequence)"
    )
