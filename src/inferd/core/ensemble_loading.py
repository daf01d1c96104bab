"""Ensembles as models to load: the models their steps name, the cycles such loads can form, and
the `EnsembleHandle` made once the steps serve.

Loading an ensemble first loads the models its steps name that do not serve (outside the
ensemble's lock, so two loads never wait for each other; `load_steps`), and a chain of loads that
comes back to a model it is loading is a cycle, a load error (`check_no_cycle`: the chain travels
in a context variable through the loads it starts). The handle is then planned against the step
models' configs (core.ensemble.plan_ensemble) and given the dispatcher, through which each step is
a request to its model: looked up per request (a step model's hot swap reaches the ensemble at
once), batched with its model's other traffic and counted in its statistics. An ensemble whose
step model does not serve is not ready, and says which (`check_steps_serving`). Unloading an
ensemble with its dependents also unloads the models it used that no other loaded ensemble uses
(`step_models`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace

from inferd.config.model import ModelConfig
from inferd.core.catalogue import ModelRecord
from inferd.core.ensemble import EnsembleHandle, StepInference, plan_ensemble, with_step_labels
from inferd.core.handle import Handle
from inferd.errors import InferdError, ModelConfigError, ModelLoadError, ModelNotReadyError

logger = logging.getLogger("inferd.registry")

# The models whose loads led to this one (an ensemble loading its steps): a name seen twice is a cycle.
_LOAD_CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("load_chain", default=())

# The ready handle serving (name, version as asked), or the InferdError that says why there is none.
ReadyHandle = Callable[[str, str], Handle]


def check_no_cycle(name: str) -> tuple[str, ...]:
    """The chain of ensemble loads this load of `name` is part of; a ModelLoadError when `name`
    is already in it."""
    chain = _LOAD_CHAIN.get()
    if name in chain:
        cycle = " → ".join((*chain[chain.index(name) :], name))
        raise ModelLoadError(f"ensembles depend on each other in a cycle: {cycle}")
    return chain


async def load_steps(
    name: str, config: ModelConfig, chain: tuple[str, ...], load_if_not_loaded: Callable[[str], Awaitable[None]]
) -> None:
    """Load the models ensemble `name`'s steps name that do not serve yet, concurrently; `chain`:
    what `check_no_cycle` returned for this load."""
    assert config.ensemble is not None
    names = config.ensemble.model_names
    token = _LOAD_CHAIN.set((*chain, name))
    try:
        results = await asyncio.gather(
            *(load_if_not_loaded(step_model) for step_model in names), return_exceptions=True
        )
    finally:
        _LOAD_CHAIN.reset(token)
    for step_model, result in zip(names, results, strict=True):
        if isinstance(result, InferdError):
            raise ModelLoadError(f"ensemble '{name}': step model '{step_model}' cannot load: {result.message}")
        if isinstance(result, BaseException):
            raise result


def ensemble_handle(
    config: ModelConfig, version: int, ready_handle: ReadyHandle, dispatch: StepInference
) -> EnsembleHandle:
    """Plan the ensemble against the configs of its step models, which serve by now; its steps
    go through `dispatch`."""
    assert config.ensemble is not None
    step_configs = []
    for index, step in enumerate(config.ensemble.steps):
        try:
            step_configs.append(ready_handle(step.model_name, step.version_label).config)
        except InferdError as exc:
            raise ModelConfigError(
                f"ensemble '{config.name}' step {index} (model '{step.model_name}'): {exc.message}"
            ) from None
    if config.response_cache:  # its answer must be a function of the request, as a cached model's
        for step_config in step_configs:
            if step_config.sequence_batching is not None or step_config.decoupled:
                raise ModelConfigError(
                    f"ensemble '{config.name}': response_cache {{ enable: true }} cannot apply: step model "
                    f"'{step_config.name}' is a {'sequence' if step_config.sequence_batching else 'decoupled'} model, "
                    "whose answers are not a function of one request"
                )
    plan = plan_ensemble(config, step_configs)
    completed = replace(with_step_labels(config, step_configs), platform=config.platform, instance_groups=())
    logger.info(
        "model %s version %d: an ensemble of %d step(s): %s",
        config.name,
        version,
        len(plan.steps),
        " → ".join(step.model_name for step in config.ensemble.steps),
        extra={"model": config.name, "version": version},
    )
    return EnsembleHandle(config=completed, version=version, plan=plan, infer_step=dispatch)


def check_steps_serving(
    ensemble: EnsembleHandle,
    serving: Mapping[tuple[str, str], Handle],
    ready_handle: ReadyHandle,
    resting: Callable[[str], bool] = lambda name: False,
) -> None:
    """ModelNotReadyError naming the first step whose model does not serve in `serving`, nor
    `resting` (scaled to zero: the step's request loads it)."""
    for planned in ensemble.plan.steps:
        step = planned.step
        if (step.model_name, step.version_label) not in serving and not resting(step.model_name):
            try:
                ready_handle(step.model_name, step.version_label)
            except InferdError as exc:
                raise ModelNotReadyError(
                    f"ensemble '{ensemble.config.name}' {planned.describe()} cannot run: {exc.message}"
                ) from None


def step_models(record: ModelRecord | None) -> tuple[str, ...]:
    """The models the loaded versions of an ensemble use (none for a plain model)."""
    found: dict[str, None] = {}
    for version in record.versions.values() if record is not None else ():
        if version.handle is not None and version.handle.config.ensemble is not None:
            found.update(dict.fromkeys(version.handle.config.ensemble.model_names))
    return tuple(found)


def models_used_by_ensembles(records: Iterable[ModelRecord]) -> set[str]:
    return {step_model for record in records for step_model in step_models(record)}
