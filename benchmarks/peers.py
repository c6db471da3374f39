"""``speclens serve`` against vLLM's CPU build on a real model, through the same client.

Both servers load the same weights (SmolLM2-135M-Instruct, exported by ``speclens export smollm2``)
in float32 with n-gram speculation K 4, prompt lookup 2..4, and ``speclens bench`` sends both the
same Spec-Bench first turns (spread over the file, so every category; chat endpoint, greedy,
``--max-tokens``, ``ignore_eos``, streamed) at each ``--concurrency``. Only one server runs at a
time (they would share two cores): each round starts ``speclens serve``, runs every concurrency,
stops it, then does the same with vLLM. The table gives the median output tok/s over rounds and
the median of the per-round ratios ours / vLLM. Goal (issue #13): at least 1.0 at concurrency 1
and 8.

vLLM comes from the peer tier's environment (``python tests/peers/vllm_env.py`` builds it once;
``make test-peers`` does too); without it the script says so and exits 1.

    python benchmarks/peers.py [--prompts 8] [--max-tokens 64] [--concurrency 1 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "peers"))
import llamacpp_env  # noqa: E402, F401  (the peer tier's llama.cpp build; benchmarks/replay.py)
import peerlaunch as launch  # noqa: E402  (the peer tier's server launcher)
import vllm_env  # noqa: E402  (the peer tier's pinned vLLM environment)

SPEC_BENCH = REPO_ROOT / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
STARTUP_TIMEOUT_S = 480.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spread_prompts(count: int, out: Path) -> Path:
    """``count`` Spec-Bench rows spread evenly over the file, as a JSONL file of their own."""
    rows = [line for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines() if line.strip()]
    step = max(1, len(rows) // count)
    out.write_text("\n".join(rows[i] for i in range(0, step * count, step)) + "\n", "utf-8")
    return out


def speclens_command(model_dir: Path, port: int) -> list[str]:
    return [
        sys.executable, "-m", "speclens", "serve", "--model", str(model_dir),
        "--served-model-name", vllm_env.SERVED_MODEL,
        "--speculative-config", json.dumps(vllm_env.NGRAM),
        "--per-request-spec-decode-stats", "summary", "--max-model-len", "2048",
        "--port", str(port),
    ]  # fmt: skip


def bench(
    url: str, prompts: Path, n: int, concurrency: int, max_tokens: int, out: Path
) -> dict[str, Any]:
    """One ``speclens bench`` run; its summary figures."""
    cmd = [
        sys.executable, "-m", "speclens", "bench", "--url", url, "--model", vllm_env.SERVED_MODEL,
        "--endpoint", "chat", "--dataset", "jsonl", "--dataset-path", str(prompts),
        "--num-requests", str(n), "--concurrency", str(concurrency), "--warmup", "1",
        "--max-tokens", str(max_tokens), "--temperature", "0", "--ignore-eos",
        "--output-dir", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"speclens bench exited {done.returncode}:\n{done.stdout[-2000:]}")
    figures: dict[str, Any] = json.loads((out / "summary.json").read_text("utf-8"))["figures"]
    return figures


def prepare(args: argparse.Namespace, prefix: str) -> tuple[Path, Path, Path] | None:
    """After checking vLLM's environment (None, and why, without it) and printing the machine:
    a work directory, the exported SmolLM2 (``--model-dir``, or exported there) and the
    ``--prompts`` spread over Spec-Bench."""
    if not vllm_env.ready():
        print(f"the vLLM environment is not built: run python tests/peers/vllm_env.py "
              f"(expected {vllm_env.stamp()})", file=sys.stderr)  # fmt: skip
        return None
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}; {args.prompts} prompts x {args.max_tokens} "
          f"tokens, concurrency {args.concurrency}, {args.rounds} rounds", flush=True)  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix=prefix))
    model_dir = args.model_dir or export_smollm2(work / vllm_env.SERVED_MODEL)
    return work, model_dir, spread_prompts(args.prompts, work / "prompts.jsonl")


def export_smollm2(out: Path) -> Path:
    """SmolLM2 as a Hugging Face directory vLLM loads (``speclens export smollm2``)."""
    subprocess.run([sys.executable, "-m", "speclens", "export", "smollm2", str(out)],
                   check=True, capture_output=True)  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, help="an exported SmolLM2 (skips the export)")
    args = parser.parse_args()
    prepared = prepare(args, "speclens-peers-")
    if prepared is None:
        return 1
    work, model_dir, prompts = prepared
    servers = {
        "speclens serve": (speclens_command, dict(os.environ)),
        "vLLM 0.32 CPU": (
            lambda d, p: vllm_env.command(d, p, vllm_env.NGRAM),
            vllm_env.environment(),
        ),
    }
    # rates[server][concurrency] = tok/s per round; al likewise
    rates: dict[str, dict[int, list[float]]] = {
        s: {c: [] for c in args.concurrency} for s in servers
    }
    als: dict[str, dict[int, list[float]]] = {s: {c: [] for c in args.concurrency} for s in servers}
    for r in range(args.rounds):
        for name, (make_cmd, env) in servers.items():
            port = free_port()
            log = work / f"{name.split()[0]}-{r}.log"
            started = time.monotonic()
            with launch.running(
                name, make_cmd(model_dir, port), port, log, STARTUP_TIMEOUT_S, env
            ) as url:
                print(f"  {name} ready in {time.monotonic() - started:.0f} s", flush=True)
                for c in args.concurrency:
                    out = work / f"{name.split()[0]}-r{r}-c{c}"
                    figures = bench(url, prompts, args.prompts, c, args.max_tokens, out)
                    rate = figures["throughput"]["output_tokens_per_s"]
                    al = figures["acceptance"]["token_weighted_al"] or 1.0
                    rates[name][c].append(rate)
                    als[name][c].append(al)
                    print(f"  round {r + 1} {name} c{c}: {rate:.1f} tok/s, AL {al:.2f}", flush=True)
    ours, theirs = servers
    print()
    print(
        "| concurrency | speclens serve tok/s | vLLM tok/s | AL ours / vLLM | ours / vLLM (median) | per round |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for c in args.concurrency:
        ratios = [a / b for a, b in zip(rates[ours][c], rates[theirs][c], strict=True)]
        print(
            f"| {c} | {median(rates[ours][c]):.1f} | {median(rates[theirs][c]):.1f} "
            f"| {median(als[ours][c]):.2f} / {median(als[theirs][c]):.2f} | {median(ratios):.2f} "
            f"| {min(ratios):.2f}-{max(ratios):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
