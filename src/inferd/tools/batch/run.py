"""A batch job, start to end: plan against what the output already holds, read, run, keep.

Each input file is read in order (on the event loop, a megabyte at a time: splitting lines is C
work, and a thread would only fight the loop for the GIL) and cut into shards of
--shard-records records, each shard into mini-batches (`pieces`). At most
--max-concurrent-transforms mini-batches run at once, each the one way a piece runs
(`mini_batches`: retries, halving refused batches). When a shard's mini-batches are all done its part is written whole
(`store`): from then on no rerun redoes it. A file whose shards are all done is assembled into its
`.out`. The job stops early when its errors pass --max-error-rate of the records read (judged once
`ERROR_RATE_MIN_RECORDS` are read, and over all of them at the end).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferd.tools.batch.engines import Engine, EngineSpec, open_engine
from inferd.tools.batch.mini_batches import MiniBatches, Phases, PieceResult, shard_part
from inferd.tools.batch.options import BatchOptions, BatchStrategy, BatchUsageError
from inferd.tools.batch.pieces import Piece, PieceCutter, ShardEnd
from inferd.tools.batch.ray_engine import RaySettings
from inferd.tools.batch.records import InputFile, list_inputs, read_records, shard_spans
from inferd.tools.batch.store import ERRORS, MANIFEST, SUMMARY, OutputStore, same_location

MANIFEST_FORMAT = "inferd.batch/1"
ERROR_RATE_MIN_RECORDS = 1000
MANIFEST_EVERY_S = 1.0
PIECES_PER_READ = 32


@dataclass(frozen=True)
class FileEnd:
    file_index: int
    shards: int
    records: int


@dataclass
class Summary:
    status: str = "running"  # complete | stopped
    reason: str = ""
    records: int = 0
    records_run: int = 0  # by this run: its throughput's
    outputs: int = 0
    errors: int = 0
    files: int = 0
    files_done: int = 0
    shards_found: int = 0  # done by an earlier run
    shards_run: int = 0
    wall_s: float = 0.0
    phases: Phases = field(default_factory=Phases)
    variants: dict[str, int] = field(default_factory=dict)  # an endpoint's records run, by variant
    error_budget: float = 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.records if self.records else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records_run / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "complete" and self.error_rate <= self.error_budget else 1

    def document(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "records": self.records,
            "outputs": self.outputs,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 6),
            "max_error_rate": self.error_budget,
            "files": self.files,
            "files_done": self.files_done,
            "shards_found_done": self.shards_found,
            "shards_run": self.shards_run,
            "seconds": round(self.wall_s, 3),
            "records_per_second": round(self.records_per_s, 1),
            "phases_seconds": {name: round(value, 3) for name, value in vars(self.phases).items()},
            **({"variants": dict(sorted(self.variants.items()))} if self.variants else {}),
        }


class Progress:
    """What the job reports as it goes (the CLI draws it with rich; tests pass none)."""

    def start(self, files: Sequence[InputFile], total_bytes: int) -> None:
        pass

    def advance(self, records: int, errors: int) -> None:
        pass

    def read(self, read_bytes: int) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass
class _FileState:
    file: InputFile
    shards: int | None = None  # known once read to its end
    done: set[int] = field(default_factory=set)
    assembled: bool = False
    no_output: bool = False  # assembled, but none written (a Parquet output with no answered record)


@dataclass
class _ShardState:
    expected: int | None = None  # its pieces, known once the shard's end was read
    results: dict[int, PieceResult] = field(default_factory=dict)  # piece -> what it gave


@dataclass
class JobPlan:
    """What the job found before it began: its inputs, its output location and what the output
    already holds (the manifest of an earlier run of the same job, or None)."""

    fs: Any
    files: list[InputFile]
    store: OutputStore
    manifest: dict[str, Any] | None

    @property
    def complete(self) -> bool:
        return self.manifest is not None and self.manifest.get("status") == "complete"


def plan_job(options: BatchOptions) -> JobPlan:
    """List the inputs and read the output's manifest: BatchUsageError when the output holds
    another job, or the same job over inputs that changed since."""
    options.check()
    if same_location(options.input, options.output):
        raise BatchUsageError("--output must not be the input or inside it: its files would be read as input")
    fs, files = list_inputs(options.input)
    store = OutputStore(options.output, options.output_kind)
    manifest = store.read_json(MANIFEST)
    if manifest is not None:
        check_same_job(manifest, options, files)
    return JobPlan(fs, files, store, manifest)


class BatchJob:
    def __init__(
        self,
        options: BatchOptions,
        engine: Engine | None,
        plan: JobPlan,
        *,
        engine_name: str = "local",
        progress: Progress | None = None,
        ray: RaySettings | None = None,
    ) -> None:
        """`engine`: where the driver runs the mini-batches; None with `ray` (each shard then runs
        on an actor of the cluster, which loads the model itself)."""
        options.check()
        self._options = options
        self._engine_name = engine_name
        self._engine = engine
        self._progress = progress or Progress()
        self._ray = ray
        self._summary = Summary(error_budget=options.max_error_rate)
        self._max_records = 1
        self._mini_batches: MiniBatches | None = None
        # The versions the model served when the job began: a rerun over others would mix them.
        self._model_versions = list(engine.signature.versions) if engine is not None else None
        if engine is not None:
            if options.batch_strategy is BatchStrategy.MULTI_RECORD and engine.max_batch_size > 0:
                self._max_records = engine.max_batch_size
            self._mini_batches = MiniBatches(options, engine, self._summary.phases)
        self._fs, self._files, self._store = plan.fs, plan.files, plan.store
        self._manifest = plan.manifest
        self._stop: str | None = None
        self._manifest_written_s = 0.0
        self._lock = asyncio.Lock()
        self._read_bytes = 0  # of the input read so far, for the progress's ETA

    # -- the job -------------------------------------------------------------------------------

    async def run(self) -> Summary:
        files, store, manifest = self._files, self._store, self._manifest
        if manifest is not None and self._model_versions is not None:
            before = manifest.get("model_versions")
            if before is not None and before != self._model_versions:
                raise BatchUsageError(
                    f"{self._options.output} holds a job begun with versions {before} of {self._options.model}, "
                    f"which now serves {self._model_versions}: its outputs would mix them; choose another --output "
                    "(or --model-version)"
                )
            self._model_versions = self._model_versions or before
        elif manifest is not None:
            self._model_versions = manifest.get("model_versions")
        self._states = [_FileState(file) for file in files]
        self._run_record: dict[str, Any] = {"started": _now(), "engine": self._engine_name}
        self._runs: list[dict[str, Any]] = list(manifest.get("runs", [])) if manifest else []
        await self._count_done(await asyncio.to_thread(store.parts_done))
        self._summary.files = len(files)
        await self._write_manifest("running", force=True)
        started = time.perf_counter()
        self._progress.start(files, sum(file.size for file in files))
        try:
            if self._ray is not None:
                await self._run_on_ray(self._ray)
            else:
                await self._run_pieces()
        finally:
            self._progress.stop()
        self._summary.wall_s = time.perf_counter() - started
        await self._finish()
        return self._summary

    async def _count_done(self, done: dict[int, set[int]]) -> None:
        for file_index, shards in done.items():
            if file_index >= len(self._states):
                continue
            self._states[file_index].done |= shards
            for shard in shards:
                header = await asyncio.to_thread(self._store.part_header, file_index, shard)
                self._summary.records += int(header["records"])
                self._summary.outputs += int(header["outputs"])
                self._summary.errors += len(header["errors"])
                self._summary.shards_found += 1

    async def _run_pieces(self) -> None:
        """Read the pieces (on the loop, a batch of them at a time) and run them on
        --max-concurrent-transforms workers."""
        self._shards: dict[tuple[int, int], _ShardState] = {}
        self._failure: BaseException | None = None
        concurrency = self._options.max_concurrent_transforms
        queue: asyncio.Queue[Piece | None] = asyncio.Queue(maxsize=2 * concurrency)
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(concurrency)]
        items = self._items()
        try:
            while self._stop is None and self._failure is None:
                read_started = time.perf_counter()
                batch = list(itertools.islice(items, PIECES_PER_READ))
                self._summary.phases.read_s += time.perf_counter() - read_started
                self._progress.read(self._read_bytes)
                if not batch:
                    break
                for item in batch:
                    if isinstance(item, FileEnd):
                        self._states[item.file_index].shards = item.shards
                        await self._maybe_assemble(item.file_index)
                    elif isinstance(item, ShardEnd):
                        shard = self._shards.setdefault((item.file_index, item.shard), _ShardState())
                        shard.expected = item.pieces
                        await self._maybe_write_shard(item.file_index, item.shard)
                    else:
                        self._shards.setdefault((item.file_index, item.shard), _ShardState())
                        await queue.put(item)
                        if self._stop is not None or self._failure is not None:
                            break
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            items.close()
        if self._failure is not None:
            raise self._failure

    async def _worker(self, queue: asyncio.Queue[Piece | None]) -> None:
        """Run pieces until told to stop; after a failure (or once the job stops) only drain the
        queue, so the reader never waits on a queue nobody reads."""
        while (piece := await queue.get()) is not None:
            if self._failure is not None or self._stop is not None:
                continue
            try:
                await self._piece(piece, self._shards[(piece.file_index, piece.shard)])
            except Exception as exc:  # the job's own fault: end it, and say so
                self._failure = exc

    def _items(self) -> Generator[Piece | ShardEnd | FileEnd, None, None]:
        """Every mini-batch still to run, in order, each shard's end and each file's end (on the
        reading thread)."""
        options = self._options
        found = [frozenset(state.done) for state in self._states]  # by earlier runs
        for file_index, state in enumerate(self._states):
            cutter = PieceCutter(
                file_index, found[file_index], options.shard_records, self._max_records, options.max_payload_bytes
            )
            count = 0
            file_start = self._read_bytes
            for chunk in read_records(self._fs, state.file, options):
                count += len(chunk)
                self._read_bytes += sum(chunk.sizes) + len(chunk)
                yield from cutter.add(chunk)
            yield from cutter.end(count)
            self._read_bytes = file_start + state.file.size
            yield FileEnd(file_index, max(1, -(-count // options.shard_records)), count)

    # -- one mini-batch ------------------------------------------------------------------------

    async def _run_on_ray(self, settings: RaySettings) -> None:
        """The shards still to do, each run on an actor of the cluster; the driver keeps what
        they give (the parts, the manifest, the `.out` files) as the local engine's does."""
        from inferd.tools.batch.ray_engine import ShardTask, run_shards

        tasks: list[ShardTask] = []
        for file_index, state in enumerate(self._states):
            started = time.perf_counter()
            spans, _ = await asyncio.to_thread(shard_spans, self._fs, state.file, self._options)
            self._summary.phases.read_s += time.perf_counter() - started
            state.shards = len(spans)
            tasks += [
                ShardTask(file_index, shard, state.file, span)
                for shard, span in enumerate(spans)
                if shard not in state.done
            ]
            await self._maybe_assemble(file_index)  # a file an earlier run finished
        nodes: set[str] = set()
        if tasks:
            shards = run_shards(settings, self._options, tasks)
            try:
                async for done in shards:
                    self._summary.phases.add(done.phases)
                    nodes.add(done.node)
                    for variant, records in done.variants.items():
                        self._summary.variants[variant] = self._summary.variants.get(variant, 0) + records
                    self._count(int(done.header["records"]), len(done.header["errors"]))
                    await self._keep_shard(done.file_index, done.shard, done.header, done.body)
                    if self._stop is not None:
                        break
            finally:
                await shards.aclose()
        self._run_record["ray_nodes"] = len(nodes)

    async def _piece(self, piece: Piece, shard: _ShardState) -> None:
        assert self._mini_batches is not None
        result = await self._mini_batches.run(piece, self._states[piece.file_index].file.name)
        shard.results[piece.seq] = result
        self._count(result.records, len(result.errors))
        await self._maybe_write_shard(piece.file_index, piece.shard)

    def _count(self, records: int, errors: int) -> None:
        summary = self._summary
        summary.records += records
        summary.records_run += records
        summary.errors += errors
        self._progress.advance(records, errors)
        if summary.records >= ERROR_RATE_MIN_RECORDS and summary.error_rate > self._options.max_error_rate:
            self._stop = (
                f"stopped on errors: {summary.errors} of {summary.records} records failed "
                f"({summary.error_rate:.2%}), more than --max-error-rate {self._options.max_error_rate:g}"
            )

    # -- keeping the work ----------------------------------------------------------------------

    async def _maybe_write_shard(self, file_index: int, shard: int) -> None:
        """Write the shard's part when its end is read and its pieces have all finished."""
        state = self._shards.get((file_index, shard))
        if state is None or state.expected is None or len(state.results) < state.expected:
            return
        del self._shards[(file_index, shard)]
        results = [state.results[seq] for seq in sorted(state.results)]
        header, body = shard_part(self._states[file_index].file.name, shard, results)
        await self._keep_shard(file_index, shard, header, body)

    async def _keep_shard(self, file_index: int, shard: int, header: dict[str, Any], body: bytes) -> None:
        """A finished shard's part written (from then on no run redoes it), its file assembled
        when it was the last."""
        started = time.perf_counter()
        await asyncio.to_thread(self._store.write_part, file_index, shard, header, body)
        self._summary.phases.write_s += time.perf_counter() - started
        self._summary.outputs += int(header["outputs"])
        self._summary.shards_run += 1
        self._states[file_index].done.add(shard)
        await self._maybe_assemble(file_index)
        await self._write_manifest("running")

    async def _maybe_assemble(self, file_index: int) -> None:
        state = self._states[file_index]
        if state.assembled or state.shards is None or len(state.done) < state.shards:
            return
        started = time.perf_counter()
        name = self._store.output_name(state.file.name)
        size = await asyncio.to_thread(self._store.assemble, file_index, range(state.shards), name)
        self._summary.phases.write_s += time.perf_counter() - started
        state.assembled = True
        state.no_output = size < 0
        self._summary.files_done += 1
        await self._write_manifest("running", force=True)

    async def _finish(self) -> None:
        summary = self._summary
        counted = getattr(self._engine, "variant_records", None)
        if counted:
            for variant, records in counted.items():
                summary.variants[variant] = summary.variants.get(variant, 0) + records
        complete = all(state.assembled for state in self._states)
        summary.status = "complete" if complete and self._stop is None else "stopped"
        if self._stop is not None:
            summary.reason = self._stop
        elif complete and summary.error_rate > self._options.max_error_rate:
            summary.reason = (
                f"{summary.errors} of {summary.records} records failed ({summary.error_rate:.2%}), "
                f"more than --max-error-rate {self._options.max_error_rate:g}"
            )
        await asyncio.to_thread(self._write_errors)
        self._run_record.update(ended=_now(), status=summary.status, shards_run=summary.shards_run)
        await asyncio.to_thread(self._store.write_json, SUMMARY, summary.document())
        await self._write_manifest(summary.status, force=True)
        if summary.status == "complete":
            await asyncio.to_thread(self._store.remove_parts)

    def _write_errors(self) -> None:
        lines: list[bytes] = []
        for file_index, state in enumerate(self._states):
            for shard in sorted(state.done):
                for row in self._store.part_header(file_index, shard)["errors"]:
                    lines.append(orjson.dumps({"file": state.file.name, **row}) + b"\n")
        self._store.write(ERRORS, b"".join(lines))

    async def _write_manifest(self, status: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._manifest_written_s < MANIFEST_EVERY_S:
            return
        self._manifest_written_s = now
        async with self._lock:
            run = {
                **self._run_record,
                "shards_found_done": self._summary.shards_found,
                "shards_run": self._summary.shards_run,
            }
            document = {
                "format": MANIFEST_FORMAT,
                "status": status,
                "job": self._options.identity(),
                "model_versions": self._model_versions,
                "inputs": [state.file.describe() for state in self._states],
                "files": [
                    {
                        "name": state.file.name,
                        "output": None if state.no_output else self._store.output_name(state.file.name),
                        "shards": state.shards,
                        "shards_done": sorted(state.done),
                        "assembled": state.assembled,
                    }
                    for state in self._states
                ],
                "runs": [*self._runs, run],
            }
            await asyncio.to_thread(self._store.write_json, MANIFEST, document)


def check_same_job(manifest: dict[str, Any], options: BatchOptions, files: Sequence[InputFile]) -> None:
    """A rerun into an output must be the same job over the same inputs (BatchUsageError)."""
    if manifest.get("format") != MANIFEST_FORMAT:
        raise BatchUsageError(f"{options.output} holds a manifest of another format ({manifest.get('format')!r})")
    job = options.identity()
    differ = sorted(key for key in set(job) | set(manifest.get("job", {})) if job.get(key) != manifest["job"].get(key))
    if differ:
        was = ", ".join(f"{key}={manifest['job'].get(key)!r}" for key in differ)
        raise BatchUsageError(
            f"{options.output} holds another job ({was}): run it with the same options to resume it, "
            "or choose another --output"
        )
    inputs = [file.describe() for file in files]
    if manifest.get("inputs") != inputs:
        before = {entry["name"]: entry for entry in manifest.get("inputs", [])}
        changed = [entry["name"] for entry in inputs if before.get(entry["name"]) != entry] or sorted(
            set(before) - {entry["name"] for entry in inputs}
        )
        raise BatchUsageError(
            f"the input changed since the job in {options.output} began ({', '.join(changed[:3])}): "
            "its outputs would mix two datasets; choose another --output"
        )


def finished_summary(previous: dict[str, Any] | None, options: BatchOptions) -> Summary:
    summary = Summary(status="complete", error_budget=options.max_error_rate)
    if previous:
        summary.records = int(previous.get("records", 0))
        summary.outputs = int(previous.get("outputs", 0))
        summary.errors = int(previous.get("errors", 0))
        summary.files = summary.files_done = int(previous.get("files", 0))
        summary.shards_found = int(previous.get("shards_run", 0)) + int(previous.get("shards_found_done", 0))
    summary.reason = "already complete: nothing to do"
    return summary


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


async def run_batch(options: BatchOptions, spec: EngineSpec, *, progress: Progress | None = None) -> Summary:
    """The job of `options` on the engine `spec` names (checked against the output before the
    engine opens: a usage error costs no model load)."""
    plan = await asyncio.to_thread(plan_job, options)
    if plan.complete:
        return finished_summary(await asyncio.to_thread(plan.store.read_json, SUMMARY), options)
    if spec.kind == "ray":
        settings = RaySettings(
            spec.ray_address, spec.repositories, options.max_concurrent_transforms, spec.execution_threads
        )
        return await BatchJob(options, None, plan, engine_name="ray", progress=progress, ray=settings).run()
    engine = await open_engine(spec, options)
    try:
        return await BatchJob(options, engine, plan, engine_name=spec.kind, progress=progress).run()
    finally:
        await engine.close()
