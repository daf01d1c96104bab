"""The PromQL a fleet's rollout is judged by: each variant's figures over a window, summed across
the replicas from the series every inferd server exposes (`inferd_endpoint_requests_total` and
`inferd_endpoint_request_duration_seconds`, requests routed by weight only, as one server's judge
counts them).

One module writes them for both judges: `inferd rollout --controller --metrics-source prometheus`
evaluates a variant's figures (`requests_in`, `errors_in`, `quantile_in`) and judges them in Python
as one server does (`core.rollout.judge`); `inferd deploy k8s` puts the guards in an Argo Rollouts
AnalysisTemplate as single expressions built from the same ones (`error_rate_delta`,
`p99_slower`), whose values the tests check against the controller's figures at one instant. Label
values may be Argo's `{{args.NAME}}` placeholders.

A counter series that first appears after a variant's first failure (each error code is a series
of its own) is counted by Prometheus from its first sample, not from zero: the failures before the
first scrape that saw that code are not in `increase()`. Later ones are.
"""

from __future__ import annotations

from collections.abc import Mapping

from inferd.types import ROUTED_BY_WEIGHT

REQUESTS = "inferd_endpoint_requests_total"
DURATION_BUCKETS = "inferd_endpoint_request_duration_seconds_bucket"


def matchers(endpoint: str, variant: str, extra: Mapping[str, str] | None = None) -> str:
    """The label matchers of one variant's requests by weight (`extra`: more labels to match,
    such as the pod template hash Argo gives a canary's pods)."""
    labels = {"endpoint": endpoint, "variant": variant, "routed": ROUTED_BY_WEIGHT, **(extra or {})}
    return ",".join(f'{name}="{_escaped(value)}"' for name, value in labels.items())


def duration(seconds: float) -> str:
    """A PromQL range of `seconds` (to the millisecond): 60s, 2500ms."""
    milliseconds = max(1, round(seconds * 1000))
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def judged_range_s(window_s: float, scrape_interval_s: float) -> float:
    """The range a window of `window_s` is judged over: at least four scrape intervals (as
    Grafana's `$__rate_interval`), since a shorter one may hold a single sample a series, from
    which `increase()` says nothing."""
    return max(window_s, 4 * scrape_interval_s)


def requests_in(selected: str, range_s: float) -> str:
    """The requests over the last `range_s` seconds."""
    return f"sum(increase({REQUESTS}{{{selected}}}[{duration(range_s)}]))"


def errors_in(selected: str, range_s: float) -> str:
    """The failed requests over the last `range_s` seconds (0 where no failure was ever counted:
    each error code is a series of its own, and none may exist yet)."""
    return f'(sum(increase({REQUESTS}{{{selected},outcome!="success"}}[{duration(range_s)}])) or vector(0))'


def quantile_in(quantile: float, selected: str, range_s: float) -> str:
    """The successful requests' latency quantile, in seconds, over the last `range_s` seconds
    (NaN without requests; a quantile above the last finite bucket is that bucket's bound, 10 s)."""
    return (
        f"histogram_quantile({quantile:g}, sum by (le) (rate({DURATION_BUCKETS}{{{selected}}}[{duration(range_s)}])))"
    )


def error_rate_delta(candidate: str, baseline: str, range_s: float, min_requests: int | str) -> str:
    """The candidate's error rate minus the baseline's over the same range; no value (an empty
    vector) while the candidate has fewer than `min_requests` requests in it. The error guard
    fails above `max_error_rate_delta`."""
    return (
        f"({_error_rate(candidate, range_s)} - {_error_rate(baseline, range_s)}) "
        f"and on() ({requests_in(candidate, range_s)} >= {min_requests})"
    )


def p99_slower(
    candidate: str, baseline: str, range_s: float, max_ratio: float | str, min_delta_s: float | str,
    min_requests: int | str,
) -> str:  # fmt: skip
    """1 when the candidate's p99 is over `max_ratio` times the baseline's *and* more than
    `min_delta_s` above it (the latency guard fails), else 0; no value while the candidate has
    fewer than `min_requests` requests in the range. Where either has no successful request the
    quantile is NaN, and a `bool` comparison with NaN is 0: the latency guard holds (the error
    guard is the one that fails a candidate that answers nothing)."""
    p99_candidate = quantile_in(0.99, candidate, range_s)
    p99_baseline = quantile_in(0.99, baseline, range_s)
    return (
        f"(({p99_candidate} / {p99_baseline}) > bool {max_ratio}) * "
        f"(({p99_candidate} - {p99_baseline}) > bool {min_delta_s}) "
        f"and on() ({requests_in(candidate, range_s)} >= {min_requests})"
    )


def _error_rate(selected: str, range_s: float) -> str:
    return f"({errors_in(selected, range_s)} / {requests_in(selected, range_s)})"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
