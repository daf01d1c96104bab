"""Endpoints: a name like a model's whose requests go to one of its variants, by weight.

An endpoint (SageMaker's word) holds production variants, each a model or a version of one, with
a weight. A request to it is routed in the inference call's first step, where a TF Serving version
label is resolved (`server.inference_call`): from then on it is a request to the variant's model,
shed, decoded, scheduled and counted as any other, and its answer names the variant.

How a variant is chosen, in this order:

- **pinned**: the client names a variant (`Inferd-Target-Variant`, SageMaker's
  `X-Amzn-SageMaker-Target-Variant`): that one, whatever its weight.
- **sticky**: the endpoint names a header (`"sticky": "X-User-Id"`) and the request carries it:
  weighted rendezvous hashing of the key over the variants. The same key reaches the same variant
  on every replica and after a restart (the hash is of the key and the variant's name, nothing
  else), and raising one variant's weight only moves keys to that variant: its scores alone grow.
- otherwise **smooth weighted round robin** (nginx's): exact shares, no clustering, no RNG, so
  90/10 over 1,000 requests is 900 and 100. Weights of a short period have their period's picks
  made once, when the endpoint is set: a request's pick is then one step of a cycle, C's work and
  no Python frame, which is most of what an endpoint costs a request over its model. The period
  is the weights' sum once they are made whole (0.9 and 33.3 are tenths, 0.001 a thousandth) and
  divided by their greatest common divisor: 90/10's is 10 picks, 20000/10000's 3, and one over
  `MAX_PRECOMPUTED_PICKS` is picked live instead.

Each variant keeps its requests of the last minute (outcome and latency), which `GET
/v2/endpoints/{name}` reports and a rollout's judge will read.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from inferd.core.request_window import RequestWindow, WindowTotals
from inferd.core.shadow import ShadowState
from inferd.errors import InvalidRequestError
from inferd.types import ROUTED_BY_WEIGHT, ROUTED_PINNED

# What an endpoint's and a variant's names may hold: they appear in URLs, headers and metric labels.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True, slots=True)
class Variant:
    """A production variant: `model`'s `version` ("": the model's newest ready one) at `weight`."""

    name: str
    model: str
    version: str = ""
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Shadow:
    """A shadow variant: `model`'s `version` gets a copy of `sample` (a share, 0 to 1) of the
    endpoint's requests, after the client's answer; its answers are compared, never sent.
    `log`: each compared pair is kept as a line of JSON in the state directory."""

    name: str
    model: str
    version: str = ""
    sample: float = 1.0
    log: bool = False


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """What a user sets: the variants, the header whose value keeps a client on one variant, and
    the shadows."""

    name: str
    variants: tuple[Variant, ...]
    sticky: str = ""
    shadows: tuple[Shadow, ...] = ()

    def __post_init__(self) -> None:
        check_name("endpoint", self.name)
        if not self.variants:
            raise InvalidRequestError(f"endpoint '{self.name}' has no variants: give at least one")
        everything: list[Variant | Shadow] = [*self.variants, *self.shadows]
        names = [each.name for each in everything]
        for each in everything:
            check_name("variant", each.name)
            if not each.model:
                raise InvalidRequestError(f"variant '{each.name}' names no model")
            if each.version and not (each.version.isascii() and each.version.isdigit()):
                raise InvalidRequestError(f"variant '{each.name}': version '{each.version}' is not a number")
        for variant in self.variants:
            if not (math.isfinite(variant.weight) and variant.weight >= 0):
                raise InvalidRequestError(f"variant '{variant.name}': weight {variant.weight} is not a number >= 0")
        for shadow in self.shadows:
            if not (math.isfinite(shadow.sample) and 0 < shadow.sample <= 1):
                raise InvalidRequestError(f"shadow '{shadow.name}': sample {shadow.sample} is not a share in (0, 1]")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidRequestError(f"endpoint '{self.name}' names variant '{repeated[0]}' more than once")
        if not any(variant.weight > 0 for variant in self.variants):
            raise InvalidRequestError(f"endpoint '{self.name}': every weight is 0, so no request could be served")
        if self.sticky and not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", self.sticky):
            raise InvalidRequestError(f"endpoint '{self.name}': sticky '{self.sticky}' is not a header name")

    def variant(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name == name:
                return variant
        known = ", ".join(v.name for v in self.variants)
        raise InvalidRequestError(f"endpoint '{self.name}' has no variant '{name}' (its variants: {known})")

    @property
    def primary(self) -> Variant:
        """The heaviest variant (the first of equals): it speaks for the endpoint's metadata."""
        return heaviest(self.variants)

    def rollout_baseline(self, candidate: str) -> Variant:
        """The variant a rollout to `candidate` moves the traffic from: the heaviest other one
        (the first of equals)."""
        self.variant(candidate)
        others = [v for v in self.variants if v.name != candidate]
        if not others:
            raise InvalidRequestError(f"endpoint '{self.name}' has no variant but '{candidate}' to roll out from")
        return heaviest(others)

    def same_servable(self, a: str, b: str) -> bool:
        """Whether variants `a` and `b` name the same model and version."""
        first, second = self.variant(a), self.variant(b)
        return (first.model, first.version) == (second.model, second.version)

    def with_weights(self, weights: dict[str, float]) -> EndpointSpec:
        """The spec with its variants' weights as `weights` says (those it does not name kept)."""
        variants = tuple(replace(v, weight=weights.get(v.name, v.weight)) for v in self.variants)
        return replace(self, variants=variants)


def heaviest(variants: Sequence[Variant]) -> Variant:
    """The variant of the greatest weight, the first of equals."""
    return max(variants, key=lambda variant: variant.weight)


def specs_of(document: dict[str, Any] | None) -> list[EndpointSpec]:
    """The endpoints a state directory's endpoints document keeps."""
    return [spec_from_document(entry) for entry in (document or {}).get("endpoints", [])]


def with_spec(document: dict[str, Any] | None, name: str, spec: EndpointSpec | None) -> dict[str, Any]:
    """The endpoints document with endpoint `name` as `spec` (added, replaced; None: removed), the
    others as they are."""
    entries = [entry for entry in (document or {}).get("endpoints", []) if entry.get("name") != name]
    if spec is not None:
        entries.append(spec_document(spec))
    return {"endpoints": sorted(entries, key=lambda entry: str(entry.get("name")))}


def spec_document(spec: EndpointSpec) -> dict[str, Any]:
    """The spec as JSON takes it, with its name: what `PUT /v2/endpoints/{name}` takes (less the
    name) and what the state directory keeps."""
    document: dict[str, Any] = {
        "name": spec.name,
        "variants": [
            {"name": v.name, "model": v.model, "version": v.version, "weight": v.weight} for v in spec.variants
        ],
    }
    if spec.sticky:
        document["sticky"] = spec.sticky
    if spec.shadows:
        document["shadow"] = [
            {"name": s.name, "model": s.model, "version": s.version, "sample": s.sample, "log": s.log}
            for s in spec.shadows
        ]
    return document


def spec_from_document(document: Any) -> EndpointSpec:
    """`spec_document`'s inverse, for the state directory's own documents (the API's bodies are
    read by `server.endpoints`, strictly)."""
    try:
        variants = tuple(
            Variant(str(v["name"]), str(v["model"]), str(v.get("version", "")), float(v.get("weight", 1.0)))
            for v in document["variants"]
        )
        shadows = tuple(
            Shadow(str(s["name"]), str(s["model"]), str(s.get("version", "")), float(s.get("sample", 1.0)),
                   bool(s.get("log", False)))
            for s in document.get("shadow", [])
        )  # fmt: skip
        return EndpointSpec(str(document["name"]), variants, str(document.get("sticky", "")), shadows)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"an endpoint kept in the state directory cannot be read: {exc!r}") from None


def check_name(kind: str, name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidRequestError(
            f"{kind} name {name!r} is not 1 to 63 letters, digits, '_', '.' or '-' starting with a letter or digit"
        )


class RoundRobin:
    """Smooth weighted round robin: each pick adds every weight to its counter, takes the largest
    counter and takes the total off it. Over any run of picks each variant's share is within one
    pick of its weight's, and picks of one variant are spread out, never bunched."""

    def __init__(self, weights: Sequence[float]) -> None:
        if not math.isfinite(sum(weights)):  # weights near the float's limit: scaled, changing no pick
            weights = [weight / max(weights) for weight in weights]
        self._weights = list(weights)
        self._total = sum(weights)
        self._current = [0.0] * len(weights)

    def pick(self) -> int:
        current, weights = self._current, self._weights
        best = 0
        for index, weight in enumerate(weights):
            current[index] += weight
            if current[index] > current[best]:
                best = index
        current[best] -= self._total
        return best


# The longest period of weighted picks made in advance (a list of this many references at most).
MAX_PRECOMPUTED_PICKS = 10_000
# Weights are read as fractions of at most this denominator when that is exactly the weight the
# user gave (0.9 is 9/10): a weight of more digits than that leaves the picks to be made live.
_WEIGHT_DENOMINATOR = 1000
# At most this many steps (picks times variants) to make a period when an endpoint is set, on the
# event loop: many variants of equal weight are picked live rather than stall it.
_MAX_PRECOMPUTING_STEPS = 100_000


def round_robin_period(weights: Sequence[float]) -> list[int] | None:
    """One period of the smooth round robin's picks over `weights` (the variants' indices), or None
    when the period is over MAX_PRECOMPUTED_PICKS (or takes over _MAX_PRECOMPUTING_STEPS to make).
    With whole weights (after scaling) the round robin's counters are back at zero after as many
    picks as the weights' sum, each variant picked its weight's times: the period, divided by the
    weights' greatest common divisor, as scaling every weight changes no pick. The picks are made
    on the whole weights, exactly: where a float weight is not exact (0.7), `RoundRobin` over the
    floats may break a near tie the other way, so the order may differ from its by a swap, never
    the shares (each variant's count in the period is exactly its weight's)."""
    shares = [Fraction(weight).limit_denominator(_WEIGHT_DENOMINATOR) for weight in weights]
    if any(float(share) != weight for share, weight in zip(shares, weights, strict=True)):
        return None
    denominator = math.lcm(*(share.denominator for share in shares))
    whole = [int(share * denominator) for share in shares]
    divisor = math.gcd(*whole)
    period = sum(whole) // divisor
    if period > MAX_PRECOMPUTED_PICKS or period * len(weights) > _MAX_PRECOMPUTING_STEPS:
        return None
    round_robin = RoundRobin([count // divisor for count in whole])
    return [round_robin.pick() for _ in range(period)]


def rendezvous(key: str, variants: Sequence[Variant]) -> int:
    """The index of the variant `key` sticks to: weighted rendezvous hashing, the highest of
    weight / -ln(u), u uniform in (0, 1) from a hash of the variant's name and the key."""
    best, best_score = 0, -1.0
    for index, variant in enumerate(variants):
        if variant.weight <= 0:
            continue
        digest = hashlib.blake2b(f"{variant.name}\0{key}".encode(), digest_size=8).digest()
        uniform = (int.from_bytes(digest, "big") + 0.5) / 2**64
        score = variant.weight / -math.log(uniform)
        if score > best_score:
            best, best_score = index, score
    return best


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request to an endpoint went: carried on its context (`RequestContext.route`), so
    that its answer names the variant and its outcome is counted there. One for each variant, made
    when the endpoint is set: routing a request makes nothing."""

    endpoint: str
    variant: str
    model: str
    version: str
    window: RequestWindow
    # Whether the endpoint has shadows (the inference call offers them the answered request).
    shadowed: bool = False
    # The variant's name as the answer's header carries it.
    variant_header: bytes = field(init=False)
    # A request's seconds and outcome ("success" or the error code), into the variant's window: the
    # window's own method (no hop between). The window is what /metrics counts, too.
    observe: Callable[[float, str], None] = field(init=False)
    # A successful request's [end on `clock`, seconds], into the window with no Python frame
    # (`RequestWindow.succeeded`): the dispatcher's call for every success.
    succeeded: Callable[[list[float]], None] = field(init=False)
    clock: Callable[[], float] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "variant_header", self.variant.encode())
        object.__setattr__(self, "observe", self.window.observe)
        object.__setattr__(self, "succeeded", self.window.succeeded)
        object.__setattr__(self, "clock", self.window.clock)


@dataclass
class Endpoint:
    """An endpoint as it serves: its spec, the round robin over its weights, each variant's window
    and route, its shadows' state. `shadow_logs`: the folder shadows with `log` write their pairs
    in; `previous`: the endpoint this one replaces, whose windows it keeps for the variants it
    keeps (same name, model and version: a weight change is not a new variant)."""

    spec: EndpointSpec
    clock: Callable[[], float] = time.monotonic
    shadow_logs: Path | None = None
    previous: Endpoint | None = field(default=None, repr=False)
    windows: dict[str, RequestWindow] = field(init=False)
    # Requests that pinned their variant: counted apart, as they are not routed by weight (a
    # rollout judges only the others).
    pinned_windows: dict[str, RequestWindow] = field(init=False)
    shadows: list[ShadowState] = field(init=False)
    # The sticky header's name as HTTP headers are keyed (lower-case bytes); b"" when not sticky.
    sticky_header: bytes = field(init=False)
    # The route of the next request routed by weight: a cycle's step over the round robin's period
    # made in advance when it is short (C's work, no Python frame: the hot path's call), else the
    # round robin's pick made live.
    next_route: Callable[[], Route] = field(init=False)
    _routes: list[Route] = field(init=False)
    _pinned_routes: list[Route] = field(init=False)

    def __post_init__(self) -> None:
        kept: dict[tuple[str, str, str], tuple[RequestWindow, RequestWindow]] = {}
        if self.previous is not None:
            previous = self.previous
            kept = {
                (v.name, v.model, v.version): (previous.windows[v.name], previous.pinned_windows[v.name])
                for v in previous.spec.variants
            }
        self.previous = None  # not kept alive
        windows = {
            v.name: kept.get((v.name, v.model, v.version)) or (RequestWindow(self.clock), RequestWindow(self.clock))
            for v in self.spec.variants
        }
        self.windows = {name: pair[0] for name, pair in windows.items()}
        self.pinned_windows = {name: pair[1] for name, pair in windows.items()}
        self.shadows = [
            ShadowState(
                self.spec.name, s.name, s.model, s.version, s.sample,
                self.shadow_logs / f"{self.spec.name}.{s.name}.jsonl" if s.log and self.shadow_logs else None,
                self.clock,
            )
            for s in self.spec.shadows
        ]  # fmt: skip
        self._routes = [
            Route(self.spec.name, v.name, v.model, v.version, self.windows[v.name], bool(self.shadows))
            for v in self.spec.variants
        ]
        self._pinned_routes = [
            Route(self.spec.name, v.name, v.model, v.version, self.pinned_windows[v.name], bool(self.shadows))
            for v in self.spec.variants
        ]
        weights = [variant.weight for variant in self.spec.variants]
        period = round_robin_period(weights)
        if period is not None:
            self.next_route = itertools.cycle([self._routes[index] for index in period]).__next__
        else:
            routes, round_robin = self._routes, RoundRobin(weights)
            self.next_route = lambda: routes[round_robin.pick()]
        self.sticky_header = self.spec.sticky.lower().encode()

    @property
    def name(self) -> str:
        return self.spec.name

    def totals(self) -> list[tuple[str, str, WindowTotals]]:
        """(variant, how routed, totals) of each variant's requests since it was set: /metrics'
        series. Routed by weight (ROUTED_BY_WEIGHT, always there, from zero: a counter Prometheus
        first sees at zero loses no request) and pinned by the client (ROUTED_PINNED, once one came),
        apart: a rollout's judge counts the first only, as on one server."""
        series = []
        for name, window in self.windows.items():
            series.append((name, ROUTED_BY_WEIGHT, window.totals()))
            pinned = self.pinned_windows[name]
            if pinned.requests_total:
                series.append((name, ROUTED_PINNED, pinned.totals()))
        return series

    def compared_answers(self, candidate: str, baseline: str) -> tuple[int, int] | None:
        """(compared, agreed) of the answers of `candidate`'s model that a shadow compared with
        `baseline`'s, on requests `baseline` answered; None when no shadow runs `candidate`'s
        model and version (as the variant names them; one still on first)."""
        chosen = self.spec.variant(candidate)
        running = [s for s in self.shadows if (s.model, s.version) == (chosen.model, chosen.version)]
        if not running:
            return None
        shadow = min(running, key=lambda s: bool(s.off_reason))
        return shadow.by_variant.get(baseline, (0, 0))

    def route(self, pinned: str | None = None, key: str | None = None) -> Route:
        """The route of one request: the `pinned` variant's, else the one `key` sticks to (when
        the endpoint is sticky and the request carried its header), else the round robin's next."""
        variants = self.spec.variants
        if pinned:
            return self._pinned_routes[variants.index(self.spec.variant(pinned))]
        if key is not None and self.spec.sticky:
            return self._routes[rendezvous(key, variants)]
        return self.next_route()


class Endpoints:
    """The endpoints the server serves, by name: what the inference call reads on every request
    (one dict lookup), and what the management API sets."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, shadow_logs: Path | None = None) -> None:
        self._clock = clock
        self.shadow_logs = shadow_logs
        self.by_name: dict[str, Endpoint] = {}

    def get(self, name: str) -> Endpoint | None:
        return self.by_name.get(name)

    def set(self, spec: EndpointSpec) -> Endpoint:
        """Serve `spec` from now on. A changed endpoint keeps the windows of the variants it keeps
        (same name, model and version): a weight change is not a new variant. Shadows start anew
        (one that turned itself off is on again)."""
        endpoint = Endpoint(spec, self._clock, self.shadow_logs, self.by_name.get(spec.name))
        self.by_name[spec.name] = endpoint
        return endpoint

    def delete(self, name: str) -> None:
        self.by_name.pop(name, None)

    def replace_all(self, specs: Iterable[EndpointSpec]) -> None:
        wanted = {spec.name: spec for spec in specs}
        for name in set(self.by_name) - set(wanted):
            self.delete(name)
        for spec in wanted.values():
            self.set(spec)

    def trim(self) -> None:
        """Hold every variant's windows to their bound (`RequestWindow.trim`): the server calls this
        every TRIM_INTERVAL_S."""
        for endpoint in list(self.by_name.values()):
            for window in (*endpoint.windows.values(), *endpoint.pinned_windows.values()):
                window.trim()

    def totals(self) -> list[tuple[str, str, str, WindowTotals]]:
        """(endpoint, variant, how routed, totals) of every variant served (safe from /metrics' thread)."""
        return [
            (name, variant, routed, totals)
            for name, endpoint in sorted(list(self.by_name.items()))
            for variant, routed, totals in endpoint.totals()
        ]

    def specs(self) -> list[EndpointSpec]:
        return [endpoint.spec for _, endpoint in sorted(self.by_name.items())]
