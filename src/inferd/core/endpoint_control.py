"""`EndpointControl`: setting and deleting endpoints, with the checks that make one safe to route
to, and keeping them in the state directory so they survive a restart.

An endpoint is set only when it can serve what its clients send: every variant's model serves
(or loads, where models load on demand), no variant is itself an endpoint, and every variant has
the first one's signature (inputs, outputs, batching), so a request that one variant takes, every
variant takes. Endpoints and models share one namespace: an endpoint cannot take a model's name,
nor a model an endpoint's (409 either way).
"""

from __future__ import annotations

from typing import Any

from inferd.config.model import ModelConfig, TensorConfig
from inferd.core.dispatcher import Dispatcher
from inferd.core.endpoints import Endpoint, Endpoints, EndpointSpec, Shadow, Variant, specs_of, with_spec
from inferd.core.registry import ModelRegistry
from inferd.core.request_window import WindowSummary
from inferd.core.rollout import FleetFigures, Guards, Rollout, RolloutController
from inferd.core.shadow import ShadowInfer, ShadowTraffic
from inferd.core.state_dir import StateDir
from inferd.errors import AlreadyExistsError, InferdError, InvalidRequestError, NotFoundError

STATE_NAME = "endpoints"
ROLLOUTS_NAME = "rollouts"
# A fleet's controller's rollouts (`inferd rollout start --controller`), kept apart from a server's
# own: a server refuses to change an endpoint one of them is rolling out.
FLEET_ROLLOUTS_NAME = "fleet-rollouts"
# How the controller command marks its rollouts there: no server takes them up or writes over them.
COMMAND_CONTROLLER = "command"


class EndpointControl:
    def __init__(
        self,
        registry: ModelRegistry,
        dispatcher: Dispatcher,
        shadow_infer: ShadowInfer,
        state: StateDir | None = None,
    ) -> None:
        """`shadow_infer`: how a shadow's copy is served (the dispatcher, in the background admission
        class); `state`: where set endpoints are kept (--state-dir), and shadows' logs; None keeps
        endpoints in memory only, and no logs."""
        # This server among those that may share the state directory (identify): it takes up its
        # own rollouts, and those of servers that are gone.
        self.server_id = ""
        self.endpoints = Endpoints(shadow_logs=state.folder("shadow") if state is not None else None)
        self.shadows = ShadowTraffic(shadow_infer, registry.metrics)
        self.rollouts = RolloutController(self, self._keep_rollouts)
        self._registry = registry
        self._dispatcher = dispatcher
        self._state = state
        # Set when a file declares the endpoints (--endpoints): the API then changes none.
        self.declared_by = ""
        # The state directory's endpoints document as this server last read or wrote it: another
        # process (a replica sharing the directory, a fleet's controller) may replace it.
        self._seen: tuple[int, int] | None = None
        # Set when this server is its fleet's rollout controller (judge_across_fleet).
        self._figures: FleetFigures | None = None
        self._rollouts_name = ROLLOUTS_NAME

    def judge_across_fleet(self, figures: FleetFigures) -> None:
        """This server is its fleet's rollout controller (--rollout-controller): its rollouts are
        judged on every replica's traffic, from `figures`, and kept where replicas sharing the state
        directory look for a fleet's (so they refuse to change the endpoint meanwhile, and never
        take the rollout up themselves). Called before any rollout starts or is restored."""
        self._figures = figures
        self._rollouts_name = FLEET_ROLLOUTS_NAME

    def restore(self) -> list[str]:
        """Serve the endpoints the state directory keeps (at startup, before the first request:
        their variants may still be loading, so they are not checked again). Their names."""
        if self._state is None:
            return []
        stamp = self._state.stamp(STATE_NAME)
        specs = specs_of(self._state.read(STATE_NAME))
        self._seen = stamp
        self.endpoints.replace_all(specs)
        return [spec.name for spec in specs]

    async def follow_state(self) -> dict[str, str]:
        """Serve what the state directory's endpoints document says, when another process replaced
        it since this server last read or wrote it (replicas sharing the directory: a PUT to any
        of them, or a fleet's controller, reaches all). Changed endpoints are set again (the
        windows of the variants they keep stay), those it no longer names go; an endpoint this
        server is rolling out is its rollout's. What could not be set, by name, with why."""
        if self._state is None or self.declared_by:
            return {}
        stamp = self._state.stamp(STATE_NAME)
        if stamp is None or stamp == self._seen:
            return {}
        # Read (and checked) before it counts as seen: a document that cannot be read now is read
        # again at the next poll.
        specs = {spec.name: spec for spec in specs_of(self._state.read(STATE_NAME))}
        self._seen = stamp
        for name in set(self.endpoints.by_name) - set(specs):
            if not self.rollouts.is_running(name):
                self.endpoints.delete(name)
        problems = {}
        for spec in specs.values():
            current = self.endpoints.get(spec.name)
            if self.rollouts.is_running(spec.name) or (current is not None and current.spec == spec):
                continue
            try:
                await self._set(spec, keep=False)
            except InferdError as exc:
                problems[spec.name] = exc.message
        return problems

    def identify(self, server_id: str) -> None:
        """This server's name among those that may share the state directory (its host and port),
        held alive there (a lock the system releases when the process ends) for as long as it runs."""
        self.server_id = server_id
        if self._state is not None:
            self._state.hold(server_id)

    async def restore_rollouts(self) -> list[str]:
        """Take up the rollouts the state directory keeps (once the models serve): this server's,
        and those of servers sharing the directory that are gone (a server restarted under another
        name is one). Running ones go on. The endpoints whose rollout resumed."""
        return await self._take_up(startup=True)

    async def take_up_orphans(self) -> list[str]:
        """Take up the running rollouts of servers sharing the directory that have gone since (a
        replica that died mid-rollout): nobody else judges them. The endpoints taken up."""
        state = self._state
        if state is None:
            return []
        foreign = {
            str(d.get("server", "")) for d in self._kept_rollouts() if Rollout.is_active(d) and not self._is_mine(d)
        }
        if not any(owner and not state.alive(owner) for owner in foreign):
            return []
        return await self._take_up(startup=False)

    async def _take_up(self, startup: bool) -> list[str]:
        """This server's kept rollouts (at startup) and those of gone servers of endpoints it serves
        and does not roll out itself: the latter become its own in the document (under its lock,
        so two replicas never take up one rollout), then go on here."""
        state = self._state
        if state is None:
            return []
        taken: list[dict[str, Any]] = []

        def adopt(kept: Any) -> dict[str, Any]:
            documents = (kept or {}).get("rollouts", [])
            owners = {str(d.get("server", "")) for d in documents} - {"", self.server_id}
            gone = {owner for owner in owners if not state.alive(owner)}
            for document in documents:
                if document.get("controller") == COMMAND_CONTROLLER:
                    continue
                endpoint = str(document.get("endpoint"))
                wanted = (startup and self._is_mine(document)) or document.get("server", "") in gone
                # One running rollout an endpoint: not one this server runs, nor a second taken now.
                clash = self.rollouts.is_running(endpoint) or (
                    Rollout.is_active(document)
                    and any(Rollout.is_active(t) and t["endpoint"] == endpoint for t in taken)
                )
                if wanted and endpoint in self.endpoints.by_name and not clash:
                    document["server"] = self.server_id
                    taken.append(document)
            return {"rollouts": documents}

        state.update(self._rollouts_name, adopt)
        await self.rollouts.restore(taken)
        return [d["endpoint"] for d in taken if Rollout.is_active(d)]

    # -- rollouts ----------------------------------------------------------------------------------

    async def start_rollout(
        self, name: str, candidate: str, strategy: str, bake_s: float, guards: Guards, webhook: str = ""
    ) -> Rollout:
        """Move `name`'s traffic to its variant `candidate` by `strategy`, from its heaviest other
        variant (the baseline). The candidate must serve now (its warm-up done)."""
        if self.declared_by:
            raise AlreadyExistsError(
                f"the endpoints are declared by {self.declared_by}: their weights are the file's, not a rollout's"
            )
        self._check_no_rollout_elsewhere(name)
        if self._figures is not None and guards.max_drift is not None:
            raise InvalidRequestError(
                "max_drift is judged from one server's shadows: this server judges across its fleet "
                f"(--rollout-controller, {self._figures.describe()})"
            )
        spec = self.get(name).spec
        variant = spec.variant(candidate)
        baseline = spec.rollout_baseline(candidate)
        try:
            self._dispatcher.ready_handle(variant.model, variant.version)
        except InferdError as exc:
            raise InvalidRequestError(
                f"variant '{candidate}' does not serve yet ({exc.message}): it takes traffic only once loaded and warm"
            ) from None
        weights = {v.name: v.weight for v in spec.variants}
        return await self.rollouts.start(name, candidate, baseline.name, weights, strategy, bake_s, guards, webhook)

    async def set_weights(self, endpoint: str, weights: dict[str, float]) -> None:
        self.endpoints.set(self.get(endpoint).spec.with_weights(weights))
        self._keep(endpoint)

    async def summary(self, endpoint: str, variant: str, window_s: float) -> WindowSummary:
        if self._figures is not None:
            return await self._figures.summary(endpoint, variant, window_s)
        return self.get(endpoint).windows[variant].summary(window_s)

    async def unpinned_requests(self, endpoint: str, variant: str) -> int:
        if self._figures is not None:
            return await self._figures.requests(endpoint, variant)
        return self.get(endpoint).windows[variant].requests_total

    def compared_answers(self, endpoint: str, candidate: str, baseline: str) -> tuple[int, int] | None:
        if self._figures is not None:
            return None  # shadows compare answers on one server; a fleet's are not summed
        return self.get(endpoint).compared_answers(candidate, baseline)

    def same_servable(self, endpoint: str, candidate: str, baseline: str) -> bool:
        return self.get(endpoint).spec.same_servable(candidate, baseline)

    def _keep_rollouts(self, documents: list[dict[str, Any]]) -> None:
        """This server's rollouts, beside those other servers sharing the directory keep there."""
        if self._state is None:
            return
        mine = [{**document, "server": self.server_id} for document in documents]

        def change(kept: Any) -> dict[str, Any]:
            others = [d for d in (kept or {}).get("rollouts", []) if not self._is_mine(d)]
            return {"rollouts": [*others, *mine]}

        self._state.update(self._rollouts_name, change)

    def _kept_rollouts(self) -> list[dict[str, Any]]:
        assert self._state is not None
        documents: list[dict[str, Any]] = (self._state.read(self._rollouts_name) or {}).get("rollouts", [])
        return documents

    def _is_mine(self, document: dict[str, Any]) -> bool:
        """A kept rollout of this server's: its own (one taken up from a server that is gone was
        renamed its own), or in a server's own document one kept before servers were named."""
        server = document.get("server", "")
        return server == self.server_id or (server == "" and self._rollouts_name == ROLLOUTS_NAME)

    def is_endpoint(self, name: str) -> bool:
        return name in self.endpoints.by_name

    def get(self, name: str) -> Endpoint:
        endpoint = self.endpoints.get(name)
        if endpoint is None:
            raise NotFoundError(f"endpoint '{name}' is not found (PUT /v2/endpoints/{name} sets it)")
        return endpoint

    async def set(self, spec: EndpointSpec) -> tuple[Endpoint, bool]:
        """Serve `spec` (a new endpoint, or new variants and weights for one); whether it is new."""
        self._check_changeable(spec.name)
        await self.follow_state()
        return await self._set(spec)

    async def declare(self, specs: list[EndpointSpec]) -> dict[str, str]:
        """Serve exactly the endpoints a file declares (--endpoints): those it no longer names go.
        What could not be set, by name, with why (a variant not serving yet: a later reading
        sets it)."""
        self.declared_by = self.declared_by or "a file (--endpoints)"
        problems = {}
        for name in set(self.endpoints.by_name) - {spec.name for spec in specs}:
            self.endpoints.delete(name)
        for spec in specs:
            current = self.endpoints.get(spec.name)
            if current is not None and current.spec == spec:
                continue
            try:
                await self._set(spec)
            except InferdError as exc:
                problems[spec.name] = exc.message
        return problems

    async def _set(self, spec: EndpointSpec, keep: bool = True) -> tuple[Endpoint, bool]:
        if self._is_model(spec.name):
            raise AlreadyExistsError(f"'{spec.name}' is a model's name: an endpoint must have a name of its own")
        if any(shadow.log for shadow in spec.shadows) and self._state is None:
            raise InvalidRequestError(
                f"endpoint '{spec.name}': a shadow's log is kept in the state directory; "
                "start the server with --state-dir"
            )
        everything: list[Variant | Shadow] = [*spec.variants, *spec.shadows]
        configs = [await self._variant_config(spec, variant) for variant in everything]
        for variant, config in zip(everything[1:], configs[1:], strict=True):
            _check_same_signature(everything[0], configs[0], variant, config)
        created = spec.name not in self.endpoints.by_name
        endpoint = self.endpoints.set(spec)
        if keep:
            self._keep(spec.name)
        return endpoint, created

    async def delete(self, name: str) -> None:
        self.get(name)
        self._check_changeable(name)
        await self.follow_state()
        self.get(name)
        self.endpoints.delete(name)
        self._keep(name)

    def check_model_name(self, name: str) -> None:
        """A model may not be loaded under an endpoint's name."""
        if self.is_endpoint(name):
            raise AlreadyExistsError(f"'{name}' is an endpoint's name (DELETE /v2/endpoints/{name} first)")

    def primary(self, name: str) -> Variant:
        """The variant that speaks for the endpoint's metadata and config: the heaviest (the first
        of equals). Every variant has its signature."""
        return self.get(name).spec.primary

    def _check_changeable(self, name: str) -> None:
        if self.declared_by:
            raise AlreadyExistsError(
                f"the endpoints are declared by {self.declared_by}: change it there, not through the API"
            )
        self._check_no_rollout_elsewhere(name)
        if self.rollouts.is_running(name):
            raise AlreadyExistsError(
                f"endpoint '{name}' has a rollout running: it sets the weights until it ends "
                f"(POST /v2/endpoints/{name}/rollout/promote or /abort)"
            )

    def _check_no_rollout_elsewhere(self, name: str) -> None:
        """Another process rolling `name` out (a fleet's controller, or a replica sharing this state
        directory) sets its weights until it ends."""
        if self._state is None:
            return
        for kept, by in ((FLEET_ROLLOUTS_NAME, "across the fleet by a controller"), (ROLLOUTS_NAME, "by a replica")):
            for document in (self._state.read(kept) or {}).get("rollouts", []):
                mine = kept == self._rollouts_name and self._is_mine(document)
                if document.get("endpoint") == name and Rollout.is_active(document) and not mine:
                    raise AlreadyExistsError(
                        f"endpoint '{name}' is being rolled out {by}: it sets the weights until the rollout ends "
                        f"(GET /v2/endpoints/{name}/rollout on the server rolling it out, or inferd rollout status "
                        "--state-dir for a controller command's, says how it goes)"
                    )

    def _is_model(self, name: str) -> bool:
        return self._registry.repository.has_model(name) or any(r.name == name for r in self._registry.records())

    async def _variant_config(self, spec: EndpointSpec, variant: Variant | Shadow) -> ModelConfig:
        if self.is_endpoint(variant.model):
            raise InvalidRequestError(f"variant '{variant.name}': '{variant.model}' is an endpoint; name a model")
        try:
            handle = self._dispatcher.lookup(variant.model, variant.version)
            if handle is None:
                handle = await self._dispatcher.lease(variant.model, variant.version)
        except InferdError as exc:
            version = f" version {variant.version}" if variant.version else ""
            raise InvalidRequestError(
                f"endpoint '{spec.name}', variant '{variant.name}': model '{variant.model}'{version} does not serve: "
                f"{exc.message}"
            ) from None
        return handle.config

    def _keep(self, name: str) -> None:
        """Endpoint `name` as this server serves it (or its absence) into the state directory's
        document, the others there as they are: replicas sharing it each write their own changes,
        under its lock."""
        if self._state is None or self.declared_by:  # a file's endpoints are the file's to keep
            return
        current = self.endpoints.get(name)
        written: list[dict[str, Any]] = []

        def change(kept: Any) -> dict[str, Any]:
            written.append(with_spec(kept, name, current.spec if current is not None else None))
            return written[-1]

        stamp = self._state.update(STATE_NAME, change)
        # Seen only when it says what this server serves: otherwise it holds another replica's change
        # too, which the next poll applies.
        if {spec.name: spec for spec in specs_of(written[-1])} == {
            e.name: e.spec for e in self.endpoints.by_name.values()
        }:
            self._seen = stamp


def _check_same_signature(
    first: Variant | Shadow, first_config: ModelConfig, other: Variant | Shadow, config: ModelConfig
) -> None:
    def differ(what: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"variant '{other.name}' ({other.model}) does not take what variant '{first.name}' ({first.model}) "
            f"takes: {what}; the variants of an endpoint must have one signature"
        )

    if (first_config.max_batch_size > 0) != (config.max_batch_size > 0):
        raise differ(f"one batches (max_batch_size {first_config.max_batch_size} against {config.max_batch_size})")
    for kind, mine, theirs in (
        ("input", first_config.inputs, config.inputs),
        ("output", first_config.outputs, config.outputs),
    ):
        by_name = {tensor.name: tensor for tensor in theirs}
        for tensor in mine:
            other_tensor = by_name.pop(tensor.name, None)
            if other_tensor is None:
                raise differ(f"it has no {kind} '{tensor.name}'")
            if _shape(other_tensor) != _shape(tensor):
                raise differ(f"{kind} '{tensor.name}' is {_describe(other_tensor)}, not {_describe(tensor)}")
        required = [name for name, tensor in by_name.items() if kind == "output" or not tensor.optional]
        if required:
            raise differ(f"it has an {kind} '{required[0]}' that variant '{first.name}' has not")


def _shape(tensor: TensorConfig) -> tuple[Any, ...]:
    return (tensor.datatype, tensor.dims)


def _describe(tensor: TensorConfig) -> str:
    return f"{tensor.datatype.value} {list(tensor.dims)}"
