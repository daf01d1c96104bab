"""`run_optimize`: source → FP32 ONNX → every candidate (`candidates.py`: ONNX ones, and bfloat16
ones in the source's own framework), each written as a model folder (config.pbtxt + version),
loaded by inferd's own runtime, run at batch 1 and at a batch of several rows when it batches,
validated against the original with `inferd validate`'s comparison at its precision's tolerances,
and timed. The fastest candidate that passes is the winner and goes to `OUTPUT/NAME/`, ready for
the repository; every passing candidate goes to `OUTPUT/NAME-KIND/` (for `inferd analyze`'s
variants); `OUTPUT/optimize.json` records all of them. A candidate that fails to build, to load or
to match is reported and never written."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from inferd.config.loader import CONFIG_FILE_NAME
from inferd.config.parameters import MIXED_PRECISION, TF_GRAPH_TAG, TF_SIGNATURE_DEF
from inferd.errors import ModelLoadError
from inferd.runtimes import TENSORFLOW, detect_runtime
from inferd.runtimes.tensorflow_layout import DEFAULT_SIGNATURE, DEFAULT_TAG, saved_model_folder
from inferd.tools import model_config
from inferd.tools.inputs import file_samples, request_shapes, synthetic_samples
from inferd.tools.optimize.candidates import (
    CANDIDATES,
    ONNX_FILE,
    BuildContext,
    Framework,
    NotApplicable,
    Precision,
    Samples,
)
from inferd.tools.optimize.export import convert_saved_model, export_hugging_face, export_torch, is_hugging_face_folder
from inferd.tools.validate import Tolerances, ValidateSettings, run_validation
from inferd.tools.validate.models import LocalModel
from inferd.tools.validate.pairs import TOKEN_INPUTS, load_tokenizer, read_pairs, tokenize
from inferd.tools.validate.run import ValidationReport
from inferd.types import DataType, ModelMetadata

ONNX_PLATFORM = "onnxruntime_onnx"
NATIVE_PLATFORMS: dict[Framework, str] = {
    "tensorflow": "tensorflow_savedmodel", "pytorch": "pytorch_libtorch", "hugging-face": "pytorch_libtorch",
}  # fmt: skip
DEFAULT_MAX_BATCH_SIZE = 32
BATCH_CHECK_ROWS = 4
TIMING_ROUNDS = 5
TIMING_RUNS = 20
# What each precision must keep of the original's answers (documented in the README). FP32 rewrites
# and FP16 must be as good as the same model on another machine; INT8 is judged by the decisions it
# changes: at most 1% of them, its embeddings within cosine 0.95 of the original's.
DEFAULT_TOLERANCES: dict[Precision, Tolerances] = {
    "fp32": Tolerances(atol=1e-3, min_cosine=0.999),
    "fp16": Tolerances(atol=1e-2, min_cosine=0.999),
    # bfloat16 keeps 8 bits of mantissa (float16 keeps 11): judged, as INT8 is, by the decisions too.
    "bf16": Tolerances(atol=5e-2, min_cosine=0.995, max_flip_rate=0.01),
    "int8": Tolerances(atol=0.1, min_cosine=0.95, max_flip_rate=0.01),
}
PRECISION_ORDER: tuple[Precision, ...] = ("fp32", "fp16", "bf16", "int8")

Status = Literal["passed", "rejected", "skipped", "error", "unservable"]
FRAMEWORK_SOURCES: dict[Framework, str] = {
    "onnx": "every source",
    "tensorflow": "TensorFlow SavedModels",
    "pytorch": "PyTorch sources (.pt, .pt2, a Hugging Face folder)",
    "hugging-face": "Hugging Face folders",
}


class OptimizeError(ValueError):
    """optimize cannot start (bad source, output in the way, inputs unusable): one line says why."""


@dataclass(frozen=True, slots=True)
class OptimizeSettings:
    source: Path
    output: Path
    name: str | None = None
    version: int = 1
    candidates: tuple[str, ...] | None = None
    """The candidates to build; None: every one that applies to the source's framework."""
    inputs: str = "random"
    """Validation inputs, as `inferd validate --inputs` (zero, random, .npz/.json/.jsonl, .tsv pairs)."""
    samples: int = 32
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    calibration: Path | None = None
    tokenizer: Path | None = None
    threshold: float = 0.5
    tolerances: Mapping[Precision, Tolerances] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    max_batch_size: int | None = None
    model_type: str = "bert"
    min_gain: float = 0.05
    """A lower precision wins only when this much faster than the best higher-precision candidate."""


@dataclass(frozen=True, slots=True)
class CandidateResult:
    name: str
    precision: Precision
    status: Status
    reason: str = ""
    latency_ms: float | None = None
    """Milliseconds per batch-1 request in-process on this machine, timed in turns with the original."""
    size_bytes: int | None = None
    validation: ValidationReport | None = None
    written_to: Path | None = None


@dataclass(frozen=True, slots=True)
class OptimizeReport:
    source: str
    reference: str
    name: str
    reference_ms: float | None
    candidates: list[CandidateResult]
    winner: str | None
    model_dir: Path | None
    """The winner's model folder (OUTPUT/NAME), None when no candidate passed."""


@dataclass(frozen=True, slots=True)
class _Prepared:
    name: str
    baseline: Path
    """The FP32 ONNX file every candidate starts from."""
    reference: str
    """What candidates are validated against (the source as inferd loads it, or its verified export)."""
    config: Any
    """The ModelConfig message candidates' configs start from."""
    metadata: ModelMetadata
    max_batch_size: int
    tokenizer: Path | None
    framework: Framework
    original: Path
    """The source's model: an ONNX file, a SavedModel folder, a .pt / .pt2 file, a Hugging Face folder."""
    native_config: Any
    """The ModelConfig message of candidates that stay in the source's framework."""


Progress = Callable[[str], None]


def run_optimize(settings: OptimizeSettings, progress: Progress = lambda _: None) -> OptimizeReport:
    unknown = [name for name in settings.candidates or () if name not in CANDIDATES]
    if unknown:
        raise OptimizeError(f"unknown candidates {unknown}; choose from {', '.join(CANDIDATES)}")
    with tempfile.TemporaryDirectory(prefix="inferd-optimize-") as scratch:
        work = Path(scratch)
        prepared = _prepare(settings, work, progress)
        kinds = settings.candidates
        if kinds is None:
            kinds = tuple(name for name, kind in CANDIDATES.items() if kind.applies_to(prepared.framework))
        target = settings.output / prepared.name
        for folder in (prepared.name, *(f"{prepared.name}-{kind}" for kind in kinds)):
            if (settings.output / folder / str(settings.version)).exists():
                raise OptimizeError(
                    f"{settings.output / folder / str(settings.version)} exists: choose another --version or --output"
                )
        _check_inputs(settings, prepared)
        context = BuildContext(prepared.baseline, work, _calibration(settings, prepared), settings.model_type,
                               prepared.original, prepared.framework)  # fmt: skip
        results = []
        with _Builder() as builder:
            for kind in kinds:
                progress(f"{kind}: building")
                results.append(
                    _try_candidate(kind, settings, prepared, context, builder, work / "candidates", progress)
                )
        progress("timing the original and the passing candidates in turns")
        reference_ms, results = _time_in_turns(results, settings, prepared, work / "candidates")
        winner = _winner(results, settings.min_gain)
        results = _write(results, settings, prepared, work / "candidates", winner)
    report = OptimizeReport(
        str(settings.source), prepared.reference, prepared.name, reference_ms, results, winner,
        target if winner is not None else None,
    )  # fmt: skip
    settings.output.mkdir(parents=True, exist_ok=True)
    (settings.output / "optimize.json").write_bytes(orjson.dumps(as_json(report), option=orjson.OPT_INDENT_2))
    return report


def _prepare(settings: OptimizeSettings, work: Path, progress: Progress) -> _Prepared:
    source = settings.source
    if not source.exists():
        raise OptimizeError(f"source '{source}' does not exist")
    baseline = work / "export" / ONNX_FILE
    tokenizer = settings.tokenizer
    if is_hugging_face_folder(source):
        progress("exporting the Hugging Face model to ONNX")
        exported = export_hugging_face(source, baseline)
        progress(f"exported: {', '.join(exported.inputs)} → {', '.join(exported.outputs)}; "
                 f"|diff| vs PyTorch {exported.max_diff:.2g}")  # fmt: skip
        if tokenizer is None and (source / "tokenizer.json").is_file():
            tokenizer = source / "tokenizer.json"
        name = settings.name or source.name
        reference_model = LocalModel(baseline)
        reference = str(baseline)
        message = None
        framework: Framework = "hugging-face"
        original = source
    else:
        model_file, message = _model_file(source)
        name = settings.name or (source.name if source.is_dir() else model_file.stem)
        reference_model = LocalModel(source)
        reference = str(source)
        original = model_file
        if model_file.suffix == ".onnx":
            baseline = model_file
            framework = "onnx"
        elif model_file.is_dir():  # a SavedModel (the reference runs it on TensorFlow, as inferd serves it)
            parameters = message.parameters if message is not None else {}
            signature = parameters[TF_SIGNATURE_DEF.name].string_value if TF_SIGNATURE_DEF.name in parameters else ""
            tag = parameters[TF_GRAPH_TAG.name].string_value if TF_GRAPH_TAG.name in parameters else ""
            framework = "tensorflow"
            progress(f"converting the SavedModel to ONNX with tf2onnx (signature {signature or DEFAULT_SIGNATURE})")
            convert_saved_model(model_file, baseline, signature or DEFAULT_SIGNATURE, tag or DEFAULT_TAG)
        elif model_file.suffix in (".pt", ".pt2"):
            framework = "pytorch"
            progress(f"exporting {model_file.name} to ONNX")
            metadata = reference_model.metadata
            batched = reference_model.max_batch_size > 0
            shapes = request_shapes(metadata, reference_model.max_batch_size, 2 if batched else 1, settings.shapes)
            examples = synthetic_samples(metadata, shapes, "random", count=1)[0]
            export_torch(model_file, baseline, [t.name for t in metadata.inputs], [t.name for t in metadata.outputs],
                         examples, batched)  # fmt: skip
        else:
            raise OptimizeError(
                f"'{model_file}' is not an ONNX, TorchScript (.pt), torch.export (.pt2) or TensorFlow SavedModel"
            )
    try:
        metadata, source_batch = reference_model.metadata, reference_model.max_batch_size
    finally:
        reference_model.close()
    max_batch_size = settings.max_batch_size
    if max_batch_size is None:
        configured = message.max_batch_size if message is not None else 0
        max_batch_size = configured or (DEFAULT_MAX_BATCH_SIZE if source_batch else 0)
    native = _native_config(name, framework, message, metadata, max_batch_size)
    config = model_config.new_message(name, ONNX_PLATFORM, max_batch_size)
    if message is not None:  # keep what the user configured (batching, instances, warmup, labels...)
        config.CopyFrom(message)
        config.name, config.platform, config.backend, config.default_model_filename = name, ONNX_PLATFORM, "", ""
        config.max_batch_size = max_batch_size
        for key in (TF_SIGNATURE_DEF.name, TF_GRAPH_TAG.name, MIXED_PRECISION.name):  # nothing of the ONNX port's
            if key in config.parameters:
                del config.parameters[key]
    return _Prepared(name, baseline, reference, config, metadata, max_batch_size, tokenizer, framework, original,
                     native)  # fmt: skip


def _native_config(name: str, framework: Framework, message: Any, metadata: ModelMetadata, max_batch_size: int) -> Any:
    """The config of a candidate in the source's framework: the source's own (its file named as the
    candidate's folder names it), else one naming the tensors as the reference does, for a program
    exported from a Hugging Face folder."""
    if framework == "onnx":
        return None
    if message is not None:
        config = replace_name(message, name)
        config.default_model_filename = ""
        config.max_batch_size = max_batch_size
        return config
    if framework != "hugging-face":  # a SavedModel or torch.export program describes itself
        return model_config.new_message(name, NATIVE_PLATFORMS[framework], max_batch_size)
    batch = 1 if max_batch_size > 0 else 0

    def described(tensors: Any) -> list[model_config.TensorDescription]:
        return [model_config.TensorDescription(t.name, DataType.from_wire(t.datatype), tuple(t.shape[batch:]))
                for t in tensors]  # fmt: skip

    return model_config.new_message(
        name, NATIVE_PLATFORMS[framework], max_batch_size, described(metadata.inputs), described(metadata.outputs)
    )


def _model_file(source: Path) -> tuple[Path, Any]:
    """The model file (or SavedModel folder) a file, version folder or model folder holds, and the
    folder's config (or None)."""
    if source.is_file():
        return source, None
    if detect_runtime(source) is not None:
        version_dir, message = source, None
    else:
        versions = sorted((int(p.name), p) for p in source.iterdir() if p.is_dir() and p.name.isdigit())
        if not versions:
            raise OptimizeError(f"'{source}' is no model file, model folder or Hugging Face model folder")
        version_dir = versions[-1][1]
        message = model_config.read_message(source) if (source / CONFIG_FILE_NAME).is_file() else None
    filename = message.default_model_filename if message is not None and message.default_model_filename else ""
    if detect_runtime(version_dir, filename) is TENSORFLOW:
        try:
            return saved_model_folder(version_dir, filename), message
        except ModelLoadError as exc:
            raise OptimizeError(exc.message) from None
    files = [version_dir / filename] if filename else sorted(
        p for p in version_dir.iterdir() if p.suffix in (".onnx", ".pt", ".pt2")
    )  # fmt: skip
    if not files:
        raise OptimizeError(f"'{version_dir}' holds no .onnx, .pt or .pt2 model file and no SavedModel")
    return files[0], message


def _check_inputs(settings: OptimizeSettings, prepared: _Prepared) -> None:
    takes_tokens = any(t.name == "input_ids" for t in prepared.metadata.inputs)
    if takes_tokens and settings.inputs in ("zero", "random"):
        raise OptimizeError(
            "the model takes token ids: validate its candidates on real text with --inputs PAIRS.tsv "
            "(and --tokenizer tokenizer.json), or on token ids from a .npz / .jsonl file"
        )
    if settings.inputs.endswith(".tsv") and prepared.tokenizer is None and takes_tokens:
        raise OptimizeError("sentence pairs need the model's tokenizer: --tokenizer tokenizer.json")


def _calibration(settings: OptimizeSettings, prepared: _Prepared) -> Samples | None:
    """Calibration samples for int8-static: each sentence of a pairs file tokenized, or a tensor file."""
    path = settings.calibration
    if path is None:
        return None
    if not path.is_file():
        raise OptimizeError(f"calibration file '{path}' does not exist")
    if path.suffix == ".tsv":
        if prepared.tokenizer is None:
            raise OptimizeError("a .tsv calibration file needs the model's tokenizer: --tokenizer tokenizer.json")
        tokenizer = load_tokenizer(prepared.tokenizer)
        pairs = read_pairs(path)
        names = [t.name for t in prepared.metadata.inputs if t.name in TOKEN_INPUTS]
        return [tokenize(tokenizer, sentence, names) for sentence in (*pairs.first, *pairs.second)]
    shapes = request_shapes(prepared.metadata, prepared.max_batch_size, 1, settings.shapes)
    return file_samples(path, prepared.metadata, shapes)


def _build_quietly(kind: str, context: BuildContext, output: Path) -> None:
    """In the build process: ONNX Runtime's tools print advice (shape inference notes) to stdout."""
    with contextlib.redirect_stdout(io.StringIO()):
        CANDIDATES[kind].build(context, output)


class _Builder:
    """Builds candidates in a child process: ONNX Runtime's tools open sessions of their own, which
    cannot coexist with the shared thread pool inferd's runtime gives this process, and a tool that
    crashes takes only its candidate down."""

    def __enter__(self) -> _Builder:
        self._pool: ProcessPoolExecutor | None = None
        return self

    def build(self, kind: str, context: BuildContext, output: Path) -> None:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        try:
            self._pool.submit(_build_quietly, kind, context, output).result()
        except BrokenProcessPool:
            self._pool = None
            raise RuntimeError("the build process died (a crash in ONNX Runtime's tools)") from None

    def __exit__(self, *_: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


def _try_candidate(
    kind: str, settings: OptimizeSettings, prepared: _Prepared, context: BuildContext, builder: _Builder,
    folder: Path, progress: Progress,
) -> CandidateResult:  # fmt: skip
    candidate = CANDIDATES[kind]
    model_dir = folder / f"{prepared.name}-{kind}"
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    result = CandidateResult(kind, candidate.precision, "error")
    try:
        if not candidate.applies_to(prepared.framework):
            raise NotApplicable(f"for {FRAMEWORK_SOURCES[candidate.framework]}; this source is {prepared.framework}")
        builder.build(kind, context, version_dir)
        if candidate.framework == "onnx":
            config = replace_name(prepared.config, model_dir.name)
        else:  # computes in bfloat16 in the source's framework
            config = replace_name(prepared.native_config, model_dir.name)
            config.parameters[MIXED_PRECISION.name].string_value = "bfloat16"
        model_config.write(model_dir, config)
    except NotApplicable as exc:
        progress(f"{kind}: skipped ({exc})")
        return replace(result, status="skipped", reason=str(exc))
    except Exception as exc:
        progress(f"{kind}: could not be built ({exc})")
        return replace(result, reason=f"build failed: {_one_line(exc)}")
    result = replace(result, size_bytes=sum(p.stat().st_size for p in version_dir.rglob("*") if p.is_file()))
    tolerances = settings.tolerances.get(candidate.precision, DEFAULT_TOLERANCES[candidate.precision])
    try:
        progress(f"{kind}: validating against the original")
        if prepared.max_batch_size > 0:
            _check_batches(model_dir, prepared, settings)
        report = run_validation(
            ValidateSettings(
                reference=prepared.reference, candidate=str(model_dir), inputs=settings.inputs,
                samples=settings.samples, shapes=settings.shapes, threshold=settings.threshold,
                tolerances=tolerances, tokenizer=prepared.tokenizer,
            )
        )  # fmt: skip
    except Exception as exc:
        progress(f"{kind}: unservable ({exc})")
        return replace(result, status="unservable", reason=f"inferd cannot serve it: {_one_line(exc)}")
    failures = [f"{c.name}: {failure}" for c in report.comparisons for failure in c.failures]
    status: Status = "passed" if report.passed else "rejected"
    progress(f"{kind}: {status} ({report.candidate_ms:.2f} ms per sample)")
    return replace(result, status=status, reason="; ".join(failures), latency_ms=report.candidate_ms,
                   validation=report)  # fmt: skip


def _time_in_turns(
    results: list[CandidateResult], settings: OptimizeSettings, prepared: _Prepared, built: Path
) -> tuple[float, list[CandidateResult]]:
    """Milliseconds per batch-1 request of the original and of each passing candidate, timed in
    turns (each round runs every model in the same order) so that a noisy machine slows all of
    them alike; the median of the rounds counts. Replaces the validation's single-pass timing."""
    sample = _timing_sample(settings, prepared)
    passed = [r for r in results if r.status == "passed"]
    models = [LocalModel(Path(prepared.reference))] + [LocalModel(built / f"{prepared.name}-{r.name}") for r in passed]
    try:
        outputs = [[t.name for t in model.metadata.outputs] for model in models]
        inputs = [
            {n: a.astype(DataType.from_wire(t.datatype).numpy_dtype) if a.dtype != object else a
             for n, a in sample.items() for t in model.metadata.inputs if t.name == n}
            for model in models
        ]  # fmt: skip
        for model, feed, names in zip(models, inputs, outputs, strict=True):
            model.run(feed, names)  # warm-up
        rounds: list[list[float]] = [[] for _ in models]
        for _ in range(TIMING_ROUNDS):
            for index, (model, feed, names) in enumerate(zip(models, inputs, outputs, strict=True)):
                started = time.perf_counter()
                for _ in range(TIMING_RUNS):
                    model.run(feed, names)
                rounds[index].append((time.perf_counter() - started) / TIMING_RUNS * 1e3)
    finally:
        for model in models:
            model.close()
    medians = [float(np.median(r)) for r in rounds]
    timed = dict(zip((r.name for r in passed), medians[1:], strict=True))
    return medians[0], [replace(r, latency_ms=timed[r.name]) if r.name in timed else r for r in results]


def _timing_sample(settings: OptimizeSettings, prepared: _Prepared) -> dict[str, np.ndarray[Any, Any]]:
    """One batch-1 request of the validation's kind: the first sentence of the pairs, else the first sample."""
    if settings.inputs.endswith(".tsv") and prepared.tokenizer is not None:
        names = [t.name for t in prepared.metadata.inputs if t.name in TOKEN_INPUTS]
        return tokenize(load_tokenizer(prepared.tokenizer), read_pairs(Path(settings.inputs)).first[0], names)
    shapes = request_shapes(prepared.metadata, prepared.max_batch_size, 1, settings.shapes)
    if settings.inputs in ("zero", "random"):
        return synthetic_samples(prepared.metadata, shapes, settings.inputs, count=1)[0]
    return file_samples(Path(settings.inputs), prepared.metadata, shapes)[0]


def replace_name(message: Any, name: str) -> Any:
    copy = type(message)()
    copy.CopyFrom(message)
    copy.name = name
    return copy


def _check_batches(model_dir: Path, prepared: _Prepared, settings: OptimizeSettings) -> None:
    """The server batches requests: several rows at once must give each row's own answer."""
    model = LocalModel(model_dir)
    try:
        rows = min(BATCH_CHECK_ROWS, prepared.max_batch_size)
        metadata = model.metadata
        shapes = {t.name: tuple(d if d >= 0 else 8 for d in t.shape[1:]) for t in metadata.inputs}
        shapes |= dict(settings.shapes)
        sample = synthetic_samples(metadata, request_shapes(metadata, rows, rows, shapes), "zero", count=1)[0]
        outputs = [t.name for t in metadata.outputs]
        together = model.run(sample, outputs)
        alone = model.run({name: array[:1] for name, array in sample.items()}, outputs)
        for name in outputs:
            if together[name].shape[0] != rows or not np.allclose(together[name][:1], alone[name], atol=1e-3):
                raise OptimizeError(f"a batch of {rows} rows does not give each row's answer in '{name}'")
    finally:
        model.close()


def _winner(results: list[CandidateResult], min_gain: float) -> str | None:
    """The fastest passing candidate; a lower precision must beat the best higher one by `min_gain`."""
    best: CandidateResult | None = None
    for precision in PRECISION_ORDER:
        passed = [r for r in results if r.precision == precision and r.status == "passed" and r.latency_ms]
        if not passed:
            continue
        fastest = min(passed, key=lambda r: r.latency_ms or 0.0)
        if best is None or (fastest.latency_ms or 0.0) < (best.latency_ms or 0.0) * (1 - min_gain):
            best = fastest
    return best.name if best is not None else None


def _write(
    results: list[CandidateResult], settings: OptimizeSettings, prepared: _Prepared, built: Path, winner: str | None
) -> list[CandidateResult]:
    targets = [(f"{prepared.name}-{r.name}", r.name) for r in results if r.status == "passed"]
    targets += [(prepared.name, winner)] if winner is not None else []
    for folder, kind in targets:  # before any is written: a folder's versions are of one platform
        _check_platform(settings.output / folder, model_config.read_message(built / f"{prepared.name}-{kind}"))
    written = []
    for result in results:
        if result.status == "passed":
            folder = f"{prepared.name}-{result.name}"
            _install(built / folder, settings.output / folder, settings.version, result, settings, folder)
            result = replace(result, written_to=settings.output / folder)
        written.append(result)
    if winner is not None:
        chosen = next(r for r in results if r.name == winner)
        _install(built / f"{prepared.name}-{winner}", settings.output / prepared.name, settings.version, chosen,
                 settings, prepared.name)  # fmt: skip
    return written


def _check_platform(target: Path, config: Any) -> None:
    """A model folder holds one platform: a version of another beside its versions would stop them loading."""
    if not (target / CONFIG_FILE_NAME).is_file():
        return
    existing = model_config.read_message(target)
    if (existing.platform, existing.backend) != (config.platform, config.backend):
        raise OptimizeError(
            f"{target} holds versions of {existing.platform or existing.backend or 'another kind'}, and this version "
            f"would be {config.platform}: write it elsewhere (--output, --name), or remove that folder"
        )


def _install(
    built: Path, target: Path, version: int, result: CandidateResult, settings: OptimizeSettings, name: str
) -> None:
    """A built candidate as model folder `target` (version `version`, config.pbtxt saying what it is)."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built / "1", target / str(version))
    comment = (
        f"Written by inferd optimize from {settings.source} ({time.strftime('%Y-%m-%d')}): candidate "
        f"'{result.name}' ({CANDIDATES[result.name].description}),\n{result.latency_ms or 0:.3f} ms per "
        "batch-1 request on the machine that optimized it, validated against the original."
    )
    model_config.write(target, replace_name(model_config.read_message(built), name), comment)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def as_json(report: OptimizeReport) -> dict[str, Any]:
    from inferd.tools.validate.run import as_json as validation_json

    return {
        "source": report.source,
        "reference": report.reference,
        "name": report.name,
        "reference_ms": report.reference_ms,
        "winner": report.winner,
        "model_dir": str(report.model_dir) if report.model_dir else None,
        "candidates": [
            {
                "name": r.name,
                "precision": r.precision,
                "status": r.status,
                "reason": r.reason,
                "latency_ms": r.latency_ms,
                "size_bytes": r.size_bytes,
                "written_to": str(r.written_to) if r.written_to else None,
                "validation": validation_json(r.validation) if r.validation else None,
            }
            for r in report.candidates
        ],
    }
