#!/usr/bin/env python3
"""What the response cache costs and gives, on one inferd with `--cache-config local,size=256MiB`:

1. A hit's cost at the server: an echo model (a Python model returning its input: the emptiest
   handler there is) with `response_cache` on, one identical request at concurrency 1 (every
   request after the first a hit), against the same model without the cache, with wrk in turns.
   The server's own figure is the statistics' `cache_hit` time per hit: the key's digest and the
   lookup (target: under 0.2 ms).
2. Throughput on a Zipf-repeated workload: the example repository's all-MiniLM-L6-v2 (ONNX) on
   the repository's 480 sentences, each request one of them drawn by Zipf's law (s = 1.1) by
   wrk's Lua, at concurrency 16, with the cache and without, in turns.

    make example && .venv/bin/python benchmarks/response_cache.py [--rounds 3] [--seconds 5]

Needs wrk (apt-get install wrk).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import Measurement, in_turns, run_wrk, wrk

from inferd.testing.models import minilm_files, python_model, write_config
from inferd.testing.server import run_server
from inferd.tools.validate.pairs import read_pairs

ROOT = Path(__file__).resolve().parents[1]
MINILM = ROOT / "examples" / "model_repository" / "minilm"
CACHE = "response_cache { enable: true }"
ZIPF_S = 1.1
console = Console(width=160)

ECHO = """
class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 16]}]
    may_run_inline = True

    def execute(self, inputs):
        return {"y": inputs["x"]}
"""


def build(root: Path) -> None:
    for name, extra in (("echo", ""), ("echo_cached", CACHE)):
        python_model(root / name / "1", ECHO)
        write_config(root / name, f'backend: "python"\nmax_batch_size: 8\n{extra}')
    for name, extra in (("minilm", ""), ("minilm_cached", CACHE)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").symlink_to((MINILM / "1" / "model.onnx").resolve())
        config = (MINILM / "config.pbtxt").read_text().replace('name: "minilm"', "")
        (root / name / "config.pbtxt").write_text(f"{config}\n{extra}\n")


def sentence_bodies() -> list[str]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_files() / "tokenizer.json"))
    pairs = read_pairs(ROOT / "examples" / "sentence_pairs.tsv")
    sentences = list(dict.fromkeys([*pairs.first, *pairs.second]))
    bodies = []
    for sentence in sentences:
        encoding = tokenizer.encode(sentence)
        inputs = [
            {"name": name, "datatype": "INT64", "shape": [1, len(values)], "data": values}
            for name, values in (("input_ids", encoding.ids), ("attention_mask", encoding.attention_mask),
                                 ("token_type_ids", encoding.type_ids))
        ]  # fmt: skip
        bodies.append(json.dumps({"inputs": inputs, "outputs": [{"name": "sentence_embedding"}]}))
    return bodies


def zipf_script(bodies: list[str], path: Path) -> Path:
    """A wrk script sending one of `bodies` a request, the k-th with weight 1 / k^s."""
    weights = [1 / (k**ZIPF_S) for k in range(1, len(bodies) + 1)]
    total, running, cdf = sum(weights), 0.0, []
    for weight in weights:
        running += weight
        cdf.append(running / total)
    lua = ["bodies = {", *(f"  {json.dumps(body)}," for body in bodies), "}", "cdf = {", ", ".join(map(str, cdf)), "}"]
    lua += [
        'wrk.method = "POST"',
        'wrk.headers["Content-Type"] = "application/json"',
        "math.randomseed(os.time())",
        "request = function()",
        "  local u, lo, hi = math.random(), 1, #cdf",
        "  while lo < hi do",
        "    local mid = math.floor((lo + hi) / 2)",
        "    if cdf[mid] < u then lo = mid + 1 else hi = mid end",
        "  end",
        "  return wrk.format(nil, nil, nil, bodies[lo])",
        "end",
    ]
    path.write_text("\n".join(lua) + "\n")
    return path


def measured(output: str) -> Measurement:
    import re

    if "Non-2xx" in output:
        raise RuntimeError(f"wrk saw errors:\n{output}")
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    return Measurement(throughput=rate)


def stats(url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=30) as response:
        return json.loads(response.read())["model_stats"][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if shutil.which("wrk") is None or not (MINILM / "1" / "model.onnx").exists():
        print("needs wrk (apt-get install wrk) and the example repository (make example)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        build(scratch / "repository")
        echo_body = json.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
        ).encode()
        script = zipf_script(sentence_bodies(), scratch / "zipf.lua")
        with run_server(
            scratch / "repository", scratch / "server.log", "--cache-config", "local,size=256MiB"
        ) as server:
            url = server.http_url

            def echo(model: str) -> Measurement:
                return wrk(f"http://{url}/v2/models/{model}/infer", echo_body, 1, args.seconds, scratch)

            def zipf(model: str) -> Measurement:
                return measured(run_wrk(f"http://{url}/v2/models/{model}/infer", script, 16, args.seconds))

            with console.status("measuring in turns"):
                hits = in_turns({"echo": lambda: echo("echo"), "echo_cached": lambda: echo("echo_cached")},
                                args.rounds)  # fmt: skip
                repeated = in_turns({"minilm": lambda: zipf("minilm"), "minilm_cached": lambda: zipf("minilm_cached")},
                                    args.rounds)  # fmt: skip
            echo_stats = stats(url, "echo_cached")["inference_stats"]
            minilm_stats = stats(url, "minilm_cached")["inference_stats"]
    hit = echo_stats["cache_hit"]
    table = Table(
        title=f"Response cache, one inferd, wrk in turns, median of {args.rounds} rounds of {args.seconds:g} s"
    )
    for column in ("workload", "without the cache", "with the cache", "ratio"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    p50 = [statistics.median(m.p50_us for m in hits[name]) for name in ("echo", "echo_cached")]
    table.add_row("echo model, one identical request, c=1: p50 µs", f"{p50[0]:.0f}", f"{p50[1]:.0f}",
                  f"{p50[1] / p50[0]:.2f}")  # fmt: skip
    rates = [statistics.median(m.throughput for m in repeated[name]) for name in ("minilm", "minilm_cached")]
    table.add_row(f"MiniLM, Zipf (s={ZIPF_S}) over 480 sentences, c=16: requests/s", f"{rates[0]:,.0f}",
                  f"{rates[1]:,.0f}", f"{rates[1] / rates[0]:.2f}")  # fmt: skip
    console.print(table)
    console.print(
        f"a hit at the server (statistics' cache_hit): {hit['ns'] / max(hit['count'], 1) / 1e3:.1f} µs over "
        f"{hit['count']:,} hits (target: under 200 µs); MiniLM's hits {minilm_stats['cache_hit']['count']:,}, "
        f"misses {minilm_stats['cache_miss']['count']:,}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
