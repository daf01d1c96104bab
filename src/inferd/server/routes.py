"""The HTTP route table: every front door (KServe v2, TF Serving, SageMaker, OpenAI, TorchServe) is a
`RouteGroup`, which owns the first path segments it serves, its routes, and how its errors look.

A door is then a group built from a codec in `protocol/` and a few handlers; `server.http.HttpApp`
finds the group, matches the route, and on an error asks the group to encode it, so a TF Serving
client gets `{"error": ...}` with TF Serving's status where a KServe client gets KServe's body.

Matching costs one dict lookup per request on the common paths: routes are indexed by segment
count and last segment (a literal such as `infer`, or a placeholder), so `/v2/models/m/infer`
never tries the other routes of its group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from inferd.errors import InferdError, MethodNotAllowedError, NotFoundError
from inferd.server.auth import Access
from inferd.server.http11 import HttpRequest, HttpResponse

Params = Mapping[str, str]
Handler = Callable[[HttpRequest, Params], Awaitable[HttpResponse]]
# The status, body and content type of an error, as the door's own clients expect them.
ErrorEncoder = Callable[[InferdError, str], tuple[int, bytes, bytes]]

# HEAD is GET without the body (server.http11 leaves it out), as RFC 9110 asks of every server.
READ = ("GET", "HEAD")


@dataclass(frozen=True, slots=True)
class Route:
    """`pattern`: "/v2/models/{model}/infer"; in a group with verbs, the last segment may end in
    ":verb" ("/v1/models/{model}:predict"), as TF Serving's paths do."""

    pattern: str
    methods: tuple[str, ...]
    handler: Handler
    # Which credentials it needs when tokens are configured (server.auth).
    access: Access = Access.DATA
    segments: tuple[str, ...] = field(init=False)
    verb: str = field(init=False)
    # (position, segment) of the literal segments, and (position, name) of the placeholders.
    _literals: tuple[tuple[int, str], ...] = field(init=False, repr=False)
    _captures: tuple[tuple[int, str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        segments = self.pattern.strip("/").split("/")
        last, _, verb = segments[-1].partition(":") if ":" in segments[-1] else (segments[-1], "", "")
        segments[-1] = last
        object.__setattr__(self, "segments", tuple(segments))
        object.__setattr__(self, "verb", verb)
        literals = tuple((i, s) for i, s in enumerate(segments) if s[:1] != "{")
        captures = tuple((i, s[1:-1]) for i, s in enumerate(segments) if s[:1] == "{")
        object.__setattr__(self, "_literals", literals)
        object.__setattr__(self, "_captures", captures)

    def match(self, parts: list[str], verb: str) -> dict[str, str] | None:
        """The placeholders' values when `parts` (as many as `segments`) fit, else None."""
        if verb != self.verb:
            return None
        for index, literal in self._literals:
            if parts[index] != literal:
                return None
        params = {name: parts[index] for index, name in self._captures}
        return None if "" in params.values() else params


@dataclass(frozen=True, slots=True)
class RouteGroup:
    """One front door: the first path segments it owns (`roots`), its routes, its error shape, and
    its name, which is the `protocol` label of its requests in the metrics."""

    protocol: str
    roots: tuple[str, ...]
    routes: tuple[Route, ...]
    encode_error: ErrorEncoder
    # Whether the last segment may carry a ":verb" (TF Serving); elsewhere a colon is a plain character.
    verbs: bool = False
    _index: dict[tuple[int, str | None], list[Route]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        index: dict[tuple[int, str | None], list[Route]] = {}
        for route in self.routes:
            last = route.segments[-1]
            key = (len(route.segments), None if last[:1] == "{" else last)
            index.setdefault(key, []).append(route)
        object.__setattr__(self, "_index", index)

    def match(self, request: HttpRequest, parts: list[str]) -> tuple[Route, dict[str, str]]:
        """The route and its parameters; NotFoundError, or MethodNotAllowedError naming the methods."""
        verb = ""
        if self.verbs and ":" in parts[-1]:
            last, _, verb = parts[-1].rpartition(":")
            parts = [*parts[:-1], last]
        count = len(parts)
        allowed: list[str] = []
        for key in ((count, parts[-1]), (count, None)):
            for route in self._index.get(key, ()):
                params = route.match(parts, verb)
                if params is None:
                    continue
                if request.method in route.methods:
                    return route, params
                allowed.extend(m for m in route.methods if m not in allowed)
        if allowed:
            raise MethodNotAllowedError(
                f"{request.method} is not allowed on {request.path}; use {' or '.join(allowed)}",
                allowed=tuple(allowed),
            )
        raise NotFoundError(f"no route for {request.method} {request.path}")


class Router:
    """Finds the group that owns a path's first segment; the fallback group answers the rest (404s)."""

    def __init__(self, groups: list[RouteGroup], fallback: RouteGroup) -> None:
        self.groups = tuple(groups)
        self.fallback = fallback
        self._groups = groups
        self._by_root: dict[str, RouteGroup] = {}
        for group in groups:
            for root in group.roots:
                if root in self._by_root:
                    claimed = self._by_root[root].protocol
                    raise ValueError(f"'/{root}' is claimed by both {claimed} and {group.protocol}")
                self._by_root[root] = group

    def group(self, parts: list[str]) -> RouteGroup:
        return self._by_root.get(parts[0], self.fallback)
