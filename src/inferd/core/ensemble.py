"""Ensembles: a model whose execution is a graph of requests to other models (Triton's ensemble
scheduler), e.g. tokenizer → encoder → pooling.

`plan_ensemble` checks the graph once, at load, against the step models' configs: every tensor a
step reads exists (an ensemble input or one step's output), names and datatypes agree, shapes can
meet, batch sizes fit, and the steps form no cycle; each mistake is a load error that names the
step and the tensor. `EnsembleHandle` then runs a request: each step starts as soon as the
tensors it reads exist, so independent steps run concurrently, and each step is an ordinary
request to its model (through `StepInference`: the dispatcher clients use too), so each step model
batches with its own traffic and counts in its own statistics. Tensors pass from step to step as
the arrays they are (BYTES elements untouched, UTF-8 or not). A step's failure answers the
request with that step's error (its status and code), its message prefixed with the step.

Requests that reach a batching ensemble (max_batch_size > 0) in the same turn of the event loop
with the same input names, datatypes and non-batch shapes, outputs and parameters run through the
steps as one batch (up to max_batch_size rows), and each gets its own rows back. Each step then
carries one request for all of them rather than one each: under load, the requests the steps
handle per client request, and the server's time per request with them, fall by the batch size
(the sentence-similarity pipeline at 16 clients: 0.39 → 0.19 ms of event-loop time per pair).
A request never waits for company beyond its loop turn. When a merged batch fails for a reason
that a request can cause (a 400), each of its requests runs again alone, so that only the faulty
one fails. In the same way, steps of one request that call the same model with tensors that
match and are ready together (the two sentences' branches of the example) go to that model as one
request, their rows one after the other, while they fit its max_batch_size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

from inferd.config.model import EnsembleStep, ModelConfig, TensorConfig
from inferd.core.handle import Handle
from inferd.core.response_cache import config_fingerprint, version_key
from inferd.core.rows import fill, merge_requests, stack_tensors, tensor_rows
from inferd.core.scheduler import Admission
from inferd.core.validation import output_names, prepare_inputs
from inferd.errors import (
    InferdError,
    InvalidRequestError,
    ModelConfigError,
    ModelOutputError,
    copied,
    with_context,
)
from inferd.types import ENSEMBLE_STEP, InferRequest, InferResponse, RequestContext, RequestedOutput, Tensor


class StepInference(Protocol):
    """How a step's request is answered: the dispatcher's `infer` (the step model's handle,
    counted), in the ensemble's request's admission class (a background job's steps are background
    work too)."""

    def __call__(self, request: InferRequest, *, admission: Admission = ...) -> Awaitable[InferResponse]: ...


@dataclass(frozen=True, slots=True)
class PlannedStep:
    index: int
    step: EnsembleStep
    # Ensemble tensors made by other steps that this step reads: it starts once they all exist.
    waits_for: frozenset[str]
    outputs: tuple[RequestedOutput, ...]
    # The step model's max_batch_size: steps of one model that are ready together go as one
    # request while their rows fit it.
    max_batch_size: int = 0

    def describe(self) -> str:
        return f"step {self.index} (model '{self.step.model_name}')"


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    steps: tuple[PlannedStep, ...]
    # Ensemble output -> the steps it needs (transitively), to run only those a request asks for.
    steps_for_output: Mapping[str, frozenset[int]]


def plan_ensemble(config: ModelConfig, step_configs: Sequence[ModelConfig]) -> EnsemblePlan:
    """Check an ensemble against its step models' configs (in step order); raise ModelConfigError
    saying where it is wrong."""
    assert config.ensemble is not None
    steps = config.ensemble.steps
    if not config.inputs or not config.outputs:
        raise ModelConfigError(
            f"ensemble '{config.name}' must declare its inputs and outputs in config.pbtxt "
            "(they cannot be read from a model file)"
        )
    # Ensemble tensor -> (its config, where it comes from): the ensemble's inputs, then steps' outputs.
    produced: dict[str, tuple[TensorConfig, ModelConfig, int | None]] = {
        t.name: (t, config, None) for t in config.inputs
    }
    for index, (step, step_config) in enumerate(zip(steps, step_configs, strict=True)):
        where = _where(config, index, step)
        _check_batching(config, step_config, where)
        for model_output, tensor in step.output_map.items():
            spec = _step_tensor(step_config, model_output, where, is_input=False)
            if tensor in produced:
                _, _, other = produced[tensor]
                owner = "an ensemble input" if other is None else f"also made by step {other}"
                raise ModelConfigError(f"{where}: output_map makes ensemble tensor '{tensor}', which is {owner}")
            produced[tensor] = (spec, step_config, index)

    planned = []
    needs: dict[int, set[int]] = {}
    for index, (step, step_config) in enumerate(zip(steps, step_configs, strict=True)):
        where = _where(config, index, step)
        waits_for = set()
        needs[index] = set()
        for model_input, tensor in step.input_map.items():
            spec = _step_tensor(step_config, model_input, where, is_input=True)
            source = produced.get(tensor)
            if source is None:
                raise ModelConfigError(
                    f"{where}: input '{model_input}' reads ensemble tensor '{tensor}', which is neither an "
                    f"input of the ensemble {[t.name for t in config.inputs]} nor an output of any step"
                )
            source_spec, source_config, source_step = source
            _check_compatible(tensor, source_spec, source_config, spec, step_config, f"{where}: input '{model_input}'")
            if source_step is not None:
                waits_for.add(tensor)
                needs[index].add(source_step)
        unmapped = [t.name for t in step_config.inputs if not t.optional and t.name not in step.input_map]
        if unmapped:
            raise ModelConfigError(f"{where}: model '{step.model_name}' needs input(s) {unmapped}, not in input_map")
        outputs = tuple(RequestedOutput(name) for name in step.output_map)
        planned.append(PlannedStep(index, step, frozenset(waits_for), outputs, step_config.max_batch_size))
    _check_acyclic(config, steps, needs)

    steps_for_output = {}
    for output in config.outputs:
        source = produced.get(output.name)
        if source is None or source[2] is None:
            raise ModelConfigError(
                f"ensemble '{config.name}': output '{output.name}' is not made by any step's output_map"
            )
        source_spec, source_config, source_step = source
        assert source_step is not None
        _check_compatible(output.name, source_spec, source_config, output, config, f"ensemble output '{output.name}'")
        steps_for_output[output.name] = frozenset(_with_ancestors(source_step, needs))
    return EnsemblePlan(tuple(planned), steps_for_output)


def with_step_labels(config: ModelConfig, step_configs: Sequence[ModelConfig]) -> ModelConfig:
    """`config` with each output that has no labels of its own labelled as the step output that
    makes it (as Triton's ensembles are), so classification names the step model's classes."""
    assert config.ensemble is not None
    made_by = {
        tensor: step_config.output(model_output)
        for step, step_config in zip(config.ensemble.steps, step_configs, strict=True)
        for model_output, tensor in step.output_map.items()
    }
    outputs = tuple(
        replace(output, labels=source.labels)
        if not output.labels and (source := made_by.get(output.name)) is not None and source.labels
        else output
        for output in config.outputs
    )
    return replace(config, outputs=outputs)


def _where(config: ModelConfig, index: int, step: EnsembleStep) -> str:
    return f"ensemble '{config.name}' step {index} (model '{step.model_name}')"


def _step_tensor(step_config: ModelConfig, name: str, where: str, *, is_input: bool) -> TensorConfig:
    kind = "input" if is_input else "output"
    spec = step_config.input(name) if is_input else step_config.output(name)
    if spec is None:
        tensors = step_config.inputs if is_input else step_config.outputs
        raise ModelConfigError(
            f"{where}: {kind}_map names {kind} '{name}', which model '{step_config.name}' does not have; "
            f"its {kind}s are {[t.name for t in tensors]}"
        )
    return spec


def _check_batching(config: ModelConfig, step_config: ModelConfig, where: str) -> None:
    # An ensemble's requests carry up to its max_batch_size rows; every step must take them.
    if config.max_batch_size > step_config.max_batch_size:
        raise ModelConfigError(
            f"{where}: the ensemble's max_batch_size {config.max_batch_size} is more than the step model's "
            f"{step_config.max_batch_size}"
        )


def _check_compatible(
    tensor: str,
    source: TensorConfig,
    source_config: ModelConfig,
    target: TensorConfig,
    target_config: ModelConfig,
    where: str,
) -> None:
    if source.datatype is not target.datatype:
        raise ModelConfigError(
            f"{where}: ensemble tensor '{tensor}' is {source.datatype.value} but {target.datatype.value} is expected"
        )
    source_shape, target_shape = source_config.full_shape(source), target_config.full_shape(target)
    compatible = len(source_shape) == len(target_shape) and all(
        a == b or a == -1 or b == -1 for a, b in zip(source_shape, target_shape, strict=True)
    )
    if not compatible:
        raise ModelConfigError(
            f"{where}: ensemble tensor '{tensor}' has shape {list(source_shape)} but {list(target_shape)} is "
            "expected (-1: any size)"
        )


def _check_acyclic(config: ModelConfig, steps: Sequence[EnsembleStep], needs: Mapping[int, set[int]]) -> None:
    """Depth-first search for a step that, through the tensors it reads, waits for itself."""
    done: set[int] = set()

    def visit(index: int, path: list[int]) -> None:
        if index in done:
            return
        if index in path:
            cycle = [*path[path.index(index) :], index]
            route = " → ".join(f"step {i} ({steps[i].model_name})" for i in cycle)
            raise ModelConfigError(f"ensemble '{config.name}': its steps form a cycle: {route}")
        for needed in sorted(needs[index]):
            visit(needed, [*path, index])
        done.add(index)

    for index in range(len(steps)):
        visit(index, [])


def _with_ancestors(index: int, needs: Mapping[int, set[int]]) -> set[int]:
    found = {index}
    stack = [index]
    while stack:
        for needed in needs[stack.pop()]:
            if needed not in found:
                found.add(needed)
                stack.append(needed)
    return found


# A step to run and its inputs, named as its model names them.
_StepCall = tuple[PlannedStep, tuple[Tensor, ...]]
# What a request that arrived with others is answered with when it must run alone after all.
_RUN_ALONE: Final = None


@dataclass(eq=False, slots=True)
class _Arrival:
    request: InferRequest
    rows: int
    future: asyncio.Future[InferResponse | None]


@dataclass(slots=True)
class EnsembleHandle(Handle):
    """An ensemble version: runs each request through the plan's steps."""

    plan: EnsemblePlan
    infer_step: StepInference
    # Requests that arrived in this loop turn, by what must be equal for them to run as one batch.
    _arriving: dict[tuple[Admission, Hashable], list[_Arrival]] = field(default_factory=dict, init=False)
    # The merged batches running now (the loop keeps only weak references to tasks).
    _batches: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    # Its name, version and config's digest: with its steps' serving versions', what its answers
    # follow (core.response_cache; the dispatcher reads the steps' at each request).
    content_key: bytes = field(default=b"", init=False)

    def __post_init__(self) -> None:
        self.content_key = version_key(self.config.name, self.version, config_fingerprint(self.config))

    async def infer(self, request: InferRequest, admission: Admission = Admission.REAL_TIME) -> InferResponse:
        """The answer to `request`, through the steps. (The dispatcher counts it in and out of the
        handle, as every request.)"""
        _, rows = prepare_inputs(self.config, request)  # the ensemble's own inputs, checked
        request.context.timing.rows = rows
        shape = self._batch_key(request)
        if shape is None:
            return await self._execute(request, rows, admission)
        key = (admission, shape)  # background requests batch with each other only
        if not self._arriving:
            asyncio.get_running_loop().call_soon(self._start_batches)
        arrival = _Arrival(request, rows, asyncio.get_running_loop().create_future())
        self._arriving.setdefault(key, []).append(arrival)
        response = await arrival.future
        if response is _RUN_ALONE:
            return await self._execute(request, rows, admission)
        return response

    def _batch_key(self, request: InferRequest) -> Hashable | None:
        """What requests must share to run as one batch; None when this one runs alone."""
        if self.config.max_batch_size <= 0:
            return None
        try:
            return (
                request.model_version,
                tuple(sorted((t.name, t.datatype, t.shape[1:]) for t in request.inputs)),
                tuple((o.name, frozenset(o.parameters.items())) for o in request.outputs),
                frozenset(request.parameters.items()),
            )
        except TypeError:  # a parameter value that cannot be compared cheaply (a list, say)
            return None

    def _start_batches(self) -> None:
        """Once the loop turn's requests have all arrived: each group runs as batches that fit
        max_batch_size; a request alone in its batch runs by itself, in its own task."""
        arriving, self._arriving = self._arriving, {}
        for (admission, _), arrivals in arriving.items():
            live = [arrival for arrival in arrivals if not arrival.future.done()]  # a client may be gone
            for batch in fill(live, _rows_of, self.config.max_batch_size):
                if len(batch) == 1:
                    _answer(batch[0].future, _RUN_ALONE)
                    continue
                task = asyncio.get_running_loop().create_task(self._execute_batch(batch, admission))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _execute_batch(self, batch: list[_Arrival], admission: Admission) -> None:
        rows = sum(arrival.rows for arrival in batch)
        merged = merge_requests([arrival.request for arrival in batch], rows)
        try:
            response = await self._execute(merged, rows, admission)
        except InvalidRequestError:
            # Only a request's own rows can be to blame: each runs alone, so only the faulty one fails.
            for arrival in batch:
                _answer(arrival.future, _RUN_ALONE)
            return
        except InferdError as exc:
            for arrival in batch:
                if not arrival.future.done():
                    arrival.future.set_exception(copied(exc))
            return
        except asyncio.CancelledError:  # the server is stopping
            for arrival in batch:
                arrival.future.cancel()
            raise
        except Exception as exc:  # a bug: every waiter hears of it
            for arrival in batch:
                if not arrival.future.done():
                    arrival.future.set_exception(exc)
            return
        start = 0
        for arrival in batch:
            end = start + arrival.rows
            request = arrival.request
            request.context.timing.compute_infer_s = merged.context.timing.compute_infer_s
            request.context.timing.batch_rows = rows
            outputs = tuple(tensor_rows(t, start, end) for t in response.outputs)
            _answer(
                arrival.future,
                InferResponse(self.config.name, str(self.version), request.context.request_id, outputs, request.id),
            )
            start = end

    async def _execute(self, request: InferRequest, batch_size: int, admission: Admission) -> InferResponse:
        """Run `request` (checked, of `batch_size` rows) through the steps its outputs need."""
        started = time.perf_counter()
        names = output_names(self.config, request)
        tensors: dict[str, Tensor] = {t.name: t for t in request.inputs}
        if request.outputs:
            wanted = frozenset().union(*(self.plan.steps_for_output[name] for name in names))
            pending = [s for s in self.plan.steps if s.index in wanted]
        else:
            pending = list(self.plan.steps)
        running: dict[asyncio.Task[dict[str, Tensor]], list[_StepCall]] = {}
        try:
            while pending or running:
                ready = [s for s in pending if s.waits_for.issubset(tensors)]
                pending = [s for s in pending if s not in ready]
                if not ready and not running:
                    missing = sorted(set().union(*(s.waits_for for s in pending)) - set(tensors))
                    raise ModelOutputError(f"ensemble '{self.config.name}': no step produced {missing}")
                together = _together(ready, tensors)
                if len(together) == 1 and not running:
                    # A chain: the next request alone can run, so run it here, without a task.
                    tensors.update(await self._run_steps(together[0], request, admission))
                    continue
                for calls in together:
                    running[asyncio.create_task(self._run_steps(calls, request, admission))] = calls
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    del running[task]
                    tensors.update(task.result())
        finally:
            for task in running:
                task.cancel()
        request.context.timing.compute_infer_s = time.perf_counter() - started
        request.context.timing.batch_rows = batch_size
        return InferResponse(
            model_name=self.config.name,
            model_version=str(self.version),
            request_id=request.context.request_id,
            outputs=tuple(self._output(name, tensors) for name in names),
            id=request.id,
        )

    async def _run_steps(
        self, calls: list[_StepCall], request: InferRequest, admission: Admission
    ) -> dict[str, Tensor]:
        """Run steps of one model as one request (a single step as itself): the tensors they make."""
        if len(calls) == 1:
            return await self._run_step(*calls[0], request, admission)
        rows = [inputs[0].shape[0] for _, inputs in calls]
        first = calls[0][0]
        try:
            stacked = stack_tensors([inputs for _, inputs in calls], sum(rows))
            response = await self.infer_step(_step_request(first, stacked, request), admission=admission)
        except InvalidRequestError:
            # Only a step's own rows can be to blame: each runs alone, so the error names its step.
            made: dict[str, Tensor] = {}
            steps = (self._run_step(p, inputs, request, admission) for p, inputs in calls)
            for outputs in await asyncio.gather(*steps):
                made.update(outputs)
            return made
        except InferdError as exc:
            where = ", ".join(str(p.index) for p, _ in calls)
            raise with_context(
                exc, f"ensemble '{self.config.name}' steps {where} (model '{first.step.model_name}')"
            ) from exc
        made = {}
        start = 0
        for (planned, _), count in zip(calls, rows, strict=True):
            for t in response.outputs:
                name = planned.step.output_map[t.name]
                made[name] = tensor_rows(t, start, start + count, name)
            start += count
        return made

    async def _run_step(
        self, planned: PlannedStep, inputs: tuple[Tensor, ...], request: InferRequest, admission: Admission
    ) -> dict[str, Tensor]:
        step = planned.step
        try:
            response = await self.infer_step(_step_request(planned, inputs, request), admission=admission)
        except InferdError as exc:
            raise with_context(exc, f"ensemble '{self.config.name}' {planned.describe()}") from exc
        return {
            step.output_map[t.name]: Tensor(step.output_map[t.name], t.datatype, t.shape, t.data)
            for t in response.outputs
        }

    def _output(self, name: str, tensors: Mapping[str, Tensor]) -> Tensor:
        found = tensors.get(name)
        if found is None:  # the plan makes every output; a step model that changed may not
            raise ModelOutputError(f"ensemble '{self.config.name}' produced no output '{name}'")
        return found


def _step_inputs(planned: PlannedStep, tensors: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
    """The step model's inputs, named as it names them."""
    return tuple(
        Tensor(name=model_input, datatype=found.datatype, shape=found.shape, data=found.data)
        for model_input, tensor in planned.step.input_map.items()
        if (found := tensors.get(tensor)) is not None  # an optional ensemble input left out
    )


def _step_request(planned: PlannedStep, inputs: tuple[Tensor, ...], request: InferRequest) -> InferRequest:
    # The step's own timing: the ensemble's request times the whole of its steps.
    context = RequestContext(request.context.request_id, request.context.deadline_s, ENSEMBLE_STEP)
    return InferRequest(
        model_name=planned.step.model_name,
        model_version=planned.step.version_label,
        inputs=inputs,
        outputs=planned.outputs,
        parameters=request.parameters,
        context=context,
    )


def _together(ready: list[PlannedStep], tensors: Mapping[str, Tensor]) -> list[list[_StepCall]]:
    """Ready steps, with their inputs, grouped into requests: steps of one model (and version)
    whose inputs match in names, datatypes and non-batch shapes and whose outputs match go
    together, while their rows fit the model's max_batch_size; any other step goes alone."""
    # key -> the group being filled and its rows
    filling: dict[Hashable, tuple[list[_StepCall], int]] = {}
    groups: list[list[_StepCall]] = []
    for planned in ready:
        inputs = _step_inputs(planned, tensors)
        if planned.max_batch_size <= 0 or not inputs:
            groups.append([(planned, inputs)])
            continue
        key = (
            planned.step.model_name,
            planned.step.version_label,
            tuple(sorted((t.name, t.datatype, t.shape[1:]) for t in inputs)),
            tuple(o.name for o in planned.outputs),
        )
        rows = inputs[0].shape[0]
        group, filled = filling.get(key, (None, 0))
        if group is not None and filled + rows <= planned.max_batch_size:
            group.append((planned, inputs))
            filling[key] = (group, filled + rows)
        else:
            group = [(planned, inputs)]
            groups.append(group)
            filling[key] = (group, rows)
    return groups


def _rows_of(arrival: _Arrival) -> int:
    return arrival.rows


def _answer(future: asyncio.Future[InferResponse | None], response: InferResponse | None) -> None:
    if not future.done():  # a client gone meanwhile
        future.set_result(response)
