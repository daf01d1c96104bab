"""A model's scale-to-zero settings: its `idle_unload_seconds` and `max_held` parameters, read
the one way here, over the server's defaults (--idle-unload-seconds, --max-held).

The config loader reads them once when a config is parsed, so a malformed value fails the
model's load with a message naming it; core reads them again from the loaded config."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from inferd.config.parameters import IDLE_UNLOAD_SECONDS, MAX_HELD
from inferd.errors import ModelConfigError

# Requests that may wait for one model's cold start unless the model or the server says otherwise:
# enough for a burst from a client pool, few enough that their decoded bodies stay small.
DEFAULT_MAX_HELD = 1024


@dataclass(frozen=True, slots=True)
class ScaleToZeroDefaults:
    """The server's defaults: `idle_unload_s` None keeps models loaded (the flag is off)."""

    idle_unload_s: float | None = None
    max_held: int = DEFAULT_MAX_HELD


# No idle unloading; the default bound on cold starts' waiters.
SCALE_TO_ZERO_OFF = ScaleToZeroDefaults()


def idle_unload_seconds(parameters: Mapping[str, str], default: float | None, source: str = "config") -> float | None:
    """Seconds of idleness after which the model unloads; None: never (`0`, or no default)."""
    text = parameters.get(IDLE_UNLOAD_SECONDS.name)
    if text is None:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ModelConfigError(
            f"{source}: parameter {IDLE_UNLOAD_SECONDS.name} must be a number of seconds, 0 or more "
            f"(0 keeps the model loaded), got {text!r}"
        )
    return seconds or None


def max_held(parameters: Mapping[str, str], default: int, source: str = "config") -> int:
    """Requests that may wait for the model's cold start at once."""
    text = parameters.get(MAX_HELD.name)
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise ModelConfigError(f"{source}: parameter {MAX_HELD.name} must be a whole number, 1 or more, got {text!r}")
    return int(text)


def check_scale_to_zero(parameters: Mapping[str, str], source: str) -> None:
    """Raise ModelConfigError when either parameter is malformed."""
    idle_unload_seconds(parameters, None, source)
    max_held(parameters, DEFAULT_MAX_HELD, source)
