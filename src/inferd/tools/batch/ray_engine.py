"""`inferd batch --engine ray`: a job's shards run on a Ray cluster (`pip install 'inferd[ray]'`).

Ray Data carries the shards still to do (each a file and its span: the bytes of a line-split
file's shard, found by the driver in one pass) to `map_batches` over a pool of actors, one shard a
batch, in order. Each actor loads the model as `--engine local` does (core.in_process: the model's
config, batching and runtimes), reads its shard's records itself (only its bytes, from the file or
the object store's URL every node reaches), cuts and runs them as the local engine would (`pieces`,
`mini_batches`: the same mini-batches, so the same bytes out) and hands back the shard's part.
The driver writes the parts, the manifest and the `.out` files (open-source Ray keeps no job to
resume), so a rerun resumes as the local engine's does, whichever engine ran before.

Ray is imported here only, when the engine is asked for; `--ray-address` joins a cluster (else a
Ray of this machine is started for the job), always without usage statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from inferd.tools.batch.engines import LocalEngine
from inferd.tools.batch.mini_batches import MiniBatches, Phases, PieceResult, shard_part
from inferd.tools.batch.options import BatchOptions, BatchStrategy, BatchUsageError
from inferd.tools.batch.pieces import Piece, PieceCutter
from inferd.tools.batch.records import InputFile, Span, open_location, read_shard

# Each actor is given one CPU: the model's executions are its work. Ray Data's own tasks have
# nothing to read (the shards travel as items), so no read task waits for a CPU the pool holds.
ACTOR_CPUS = 1.0
# Mini-batches of one shard an actor runs at once (its model batches them as a server would).
ACTOR_CONCURRENCY = 4
# The pool starts whole before the first shard: otherwise the actors ready first take every shard
# of a short job, and one that cannot be placed (the cluster too small) would go unnoticed. An
# actor is ready once its model loaded, so this covers a node the autoscaler adds, a worker's
# start and the model's load (a large one from s3://) too.
ACTORS_START_S = 900


@dataclass(frozen=True)
class RaySettings:
    address: str  # host:port of a cluster's head; "" starts a Ray of this machine for the job
    repositories: tuple[str, ...]
    actors: int  # the pool's actors
    execution_threads: int = 0


@dataclass(frozen=True)
class ShardTask:
    file_index: int
    shard: int
    file: InputFile
    span: Span

    def item(self) -> dict[str, Any]:
        """As Ray Data carries it: plain columns."""
        return {
            "file_index": self.file_index,
            "shard": self.shard,
            "task": orjson.dumps(
                {
                    "file": {
                        "path": self.file.path,
                        "name": self.file.name,
                        "size": self.file.size,
                        "version": self.file.version,
                    },
                    "span": [self.span.start, self.span.end, self.span.index, self.span.line],
                }
            ),
        }

    @classmethod
    def of(cls, file_index: int, shard: int, task: bytes) -> ShardTask:
        document = orjson.loads(task)
        return cls(file_index, shard, InputFile(**document["file"]), Span(*document["span"]))


@dataclass(frozen=True)
class ShardDone:
    file_index: int
    shard: int
    header: dict[str, Any]
    body: bytes
    phases: Phases
    node: str
    variants: dict[str, int]  # an endpoint's records of the shard, by variant


class ShardActor:
    """One actor of the pool: the model loaded once, then shard after shard."""

    def __init__(self, options: BatchOptions, input_uri: str, repositories: Sequence[str], threads: int) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._engine = self._loop.run_until_complete(
            LocalEngine.open(
                repositories,
                options.model,
                options.model_version,
                execution_threads=threads,
                endpoints=options.endpoints,
            )
        )
        self._fs, _ = open_location(input_uri)
        self._max_records = 1
        if options.batch_strategy is BatchStrategy.MULTI_RECORD and self._engine.max_batch_size > 0:
            self._max_records = self._engine.max_batch_size
        import ray

        self._node = ray.get_runtime_context().get_node_id()

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {
            "file_index": [],
            "shard": [],
            "header": [],
            "body": [],
            "phases": [],
            "node": [],
            "variants": [],
        }
        for file_index, shard, task in zip(batch["file_index"], batch["shard"], batch["task"], strict=True):
            done = self._loop.run_until_complete(self._run(ShardTask.of(int(file_index), int(shard), bytes(task))))
            out["file_index"].append(done.file_index)
            out["shard"].append(done.shard)
            out["header"].append(orjson.dumps(done.header))
            out["body"].append(done.body)
            out["phases"].append(orjson.dumps(vars(done.phases)))
            out["node"].append(done.node)
            out["variants"].append(orjson.dumps(done.variants))
        return out

    async def _run(self, task: ShardTask) -> ShardDone:
        options = self._options
        phases = Phases()
        mini_batches = MiniBatches(options, self._engine, phases)
        records = await asyncio.to_thread(read_shard, self._fs, task.file, options, task.span)
        cutter = PieceCutter(
            task.file_index, frozenset(), options.shard_records, self._max_records, options.max_payload_bytes
        )
        pieces = [item for item in [*cutter.add(records), *cutter.end(len(records))] if isinstance(item, Piece)]
        slots = asyncio.Semaphore(ACTOR_CONCURRENCY)

        async def run(piece: Piece) -> PieceResult:
            async with slots:
                return await mini_batches.run(piece, task.file.name)

        before = dict(self._engine.variant_records)
        results = await asyncio.gather(*(run(piece) for piece in pieces))
        header, body = shard_part(task.file.name, task.shard, results)
        variants = {name: count - before.get(name, 0) for name, count in self._engine.variant_records.items()}
        return ShardDone(task.file_index, task.shard, header, body, phases, self._node, variants)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # an actor torn down: nothing to tell anyone
            self._loop.run_until_complete(self._engine.close())


def connect(address: str) -> None:
    """Join the cluster at `address` (host:port), or start a Ray of this machine; no usage stats."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise BatchUsageError("--engine ray needs Ray: pip install 'inferd[ray]'") from None
    if ray.is_initialized():
        return
    ray.init(
        address=address or "local",
        include_dashboard=False if not address else None,
        configure_logging=True,
        logging_level=logging.WARNING,
        log_to_driver=False,
    )


async def run_shards(
    settings: RaySettings, options: BatchOptions, tasks: Sequence[ShardTask]
) -> AsyncGenerator[ShardDone, None]:
    """Each of `tasks` run on the cluster, in order, as its shard finishes."""
    await asyncio.to_thread(connect, settings.address)
    import ray
    import ray.data

    logging.getLogger("ray.data").setLevel(logging.WARNING)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    context.wait_for_min_actors_s = ACTORS_START_S
    items = ray.data.from_items([task.item() for task in tasks], override_num_blocks=max(1, len(tasks)))
    dataset = items.map_batches(
        ShardActor,
        fn_constructor_args=(options, options.input, settings.repositories, settings.execution_threads),
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=settings.actors),
        num_cpus=ACTOR_CPUS,
    )
    rows = iter(dataset.iter_rows())
    try:
        while (row := await asyncio.to_thread(next, rows, None)) is not None:
            yield ShardDone(
                int(row["file_index"]),
                int(row["shard"]),
                orjson.loads(row["header"]),
                bytes(row["body"]),
                Phases(**orjson.loads(row["phases"])),
                str(row["node"]),
                orjson.loads(row["variants"]),
            )
    finally:
        await asyncio.to_thread(ray.shutdown)
