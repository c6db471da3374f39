"""``speclens serve`` against vLLM's CPU build on a real model, through the same client.

Both servers load the same weights (SmolLM2-135M-Instruct, exported by ``speclens export smollm2``)
in ``--dtype`` (float32 by default, both servers alike) with n-gram speculation K 4, prompt lookup
2..4, and ``speclens bench`` sends both the same Spec-Bench first turns (spread over the file, so
every category; chat endpoint, greedy, ``--max-tokens``, ``ignore_eos``, streamed) at each
``--concurrency``. Only one server runs at a time (they would share two cores): each round starts
``speclens serve``, runs every concurrency, stops it, then does the same with vLLM. The table gives
the median output tok/s over rounds and the median of the per-round ratios ours / vLLM. Goal
(issue #43): at least 1.5 at concurrency 1 and 8, with the same tokens.

Same tokens: in the first round each server also answers every prompt once more, one at a time and
not streamed; the table counts the prompts whose text is the same from both servers.

Of bound: each server's tok/s over what this machine's memory bandwidth allows. A decode step
reads every weight once and the KV cache of each running request, and yields tokens per decode step
(the bench's figure) per request; the bandwidth is a read of a 512 MiB tensor on every core,
measured at the start of each round (the best of them is used). With the AL, the bound is
``c * tokens_per_step * bandwidth / (weight bytes + c * KV bytes at the mean context)``, the tokens
a decode step speclens's for both (the same text and drafting; vLLM's counters count no decode
steps, so its own figure would be 1 and its bound too low), the KV
bytes each server's own (speclens keeps a float32 cache on a CPU whatever ``--dtype``; vLLM the
model's dtype).

vLLM comes from the peer tier's environment (``python tests/peers/vllm_env.py`` builds it once;
``make test-peers`` does too); without it the script says so and exits 1.

    python benchmarks/peers.py [--prompts 8] [--max-tokens 64] [--concurrency 1 8] [--rounds 2]
        [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from statistics import median
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "peers"))
import llamacpp_env  # noqa: E402, F401  (the peer tier's llama.cpp build; benchmarks/replay.py)
import machine  # noqa: E402  (benchmarks/machine.py: the read bandwidth)
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


def speclens_command(model_dir: Path, port: int, dtype: str = "float32") -> list[str]:
    return [
        sys.executable, "-m", "speclens", "serve", "--model", str(model_dir),
        "--served-model-name", vllm_env.SERVED_MODEL,
        "--speculative-config", json.dumps(vllm_env.NGRAM),
        "--per-request-spec-decode-stats", "summary", "--max-model-len", "2048",
        "--dtype", dtype, "--port", str(port),
    ]  # fmt: skip


def read_bandwidth() -> float:
    """The read bandwidth on every core (``machine.read_bandwidth``)."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    return machine.read_bandwidth()


def step_bytes(model_dir: Path, dtype: str, kv_dtype: str) -> tuple[int, int]:
    """(bytes of every weight in ``dtype``, bytes of KV cache per token of context in
    ``kv_dtype``): a decode step reads all the first once (a tied LM head is the embedding
    matrix, read once) and, for each running request, the second times its context."""
    config = json.loads((model_dir / "config.json").read_text("utf-8"))
    hidden, inner, layers = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_hidden_layers"],
    )
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    per_layer = hidden * (2 * heads + 2 * kv_heads) * head_dim + 3 * hidden * inner + 2 * hidden
    vocab = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    size, kv_size = (2 if name == "bfloat16" else 4 for name in (dtype, kv_dtype))
    weights = (layers * per_layer + vocab + hidden) * size
    return weights, layers * 2 * kv_heads * head_dim * kv_size


def bound(
    figures: dict[str, Any],
    concurrency: int,
    bandwidth: float,
    sizes: tuple[int, int],
    per_step: float,
) -> float:
    """Output tok/s that ``bandwidth`` allows a run with these figures, at ``per_step`` tokens a
    decode step (module docstring)."""
    requests = max(1, figures["requests"]["completed"])
    throughput = figures["throughput"]
    context = (throughput["total_prompt_tokens"] + throughput["total_output_tokens"] / 2) / requests
    weights, kv_per_token = sizes
    step = weights + concurrency * kv_per_token * context
    return float(concurrency * per_step * bandwidth / step)


def texts(url: str, prompts: Path, max_tokens: int) -> list[str]:
    """Each prompt's greedy chat completion, one request at a time, not streamed."""
    out = []
    for line in prompts.read_text("utf-8").splitlines():
        body = {
            "model": vllm_env.SERVED_MODEL, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "messages": [{"role": "user", "content": json.loads(line)["turns"][0]}],
        }  # fmt: skip
        request = urllib.request.Request(
            url + "/v1/chat/completions", json.dumps(body).encode(),
            {"content-type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as resp:
            out.append(json.loads(resp.read())["choices"][0]["message"]["content"])
    return out


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
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="both servers' --dtype")  # fmt: skip
    args = parser.parse_args()
    # SIGTERM (a timeout) unwinds like Ctrl-C, so the running server's group is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prepared = prepare(args, "speclens-peers-")
    if prepared is None:
        return 1
    work, model_dir, prompts = prepared
    dtype = args.dtype
    servers = {
        "speclens serve": (lambda d, p: speclens_command(d, p, dtype), dict(os.environ)),
        "vLLM 0.32 CPU": (
            lambda d, p: vllm_env.command(d, p, vllm_env.NGRAM, ["--dtype", dtype]),
            vllm_env.environment(),
        ),
    }
    # speclens keeps a float32 KV cache on a CPU whatever the weights' dtype; vLLM, the model's.
    sizes = {
        name: step_bytes(model_dir, dtype, "float32" if name == "speclens serve" else dtype)
        for name in servers
    }
    bandwidths: list[float] = []
    bounds: dict[str, dict[int, list[float]]] = {
        s: {c: [] for c in args.concurrency} for s in servers
    }
    answers: dict[str, list[str]] = {}
    # rates[server][concurrency] = tok/s per round; al likewise
    rates: dict[str, dict[int, list[float]]] = {
        s: {c: [] for c in args.concurrency} for s in servers
    }
    als: dict[str, dict[int, list[float]]] = {s: {c: [] for c in args.concurrency} for s in servers}
    per_step: dict[str, dict[int, list[float | None]]] = {
        s: {c: [] for c in args.concurrency} for s in servers
    }
    for r in range(args.rounds):
        bandwidths.append(read_bandwidth())
        print(f"  round {r + 1}: read bandwidth {bandwidths[-1] / 1e9:.1f} GB/s; a step reads "
              f"{sizes['vLLM 0.32 CPU'][0] / 1e9:.3f} GB of weights ({dtype})", flush=True)  # fmt: skip
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
                    # x bandwidth and tokens a decode step later
                    bounds[name][c].append(bound(figures, c, 1.0, sizes[name], 1.0))
                    per_step[name][c].append(figures["acceptance"].get("tokens_per_decode_step"))
                    print(f"  round {r + 1} {name} c{c}: {rate:.1f} tok/s, AL {al:.2f}", flush=True)
                if r == 0:
                    answers[name] = texts(url, prompts, args.max_tokens)
    ours, theirs = servers
    bandwidth = max(bandwidths)
    weights, kv_ours, kv_theirs = sizes[ours][0], sizes[ours][1], sizes[theirs][1]
    same = sum(a == b for a, b in zip(answers[ours], answers[theirs], strict=True))
    print(f"\nread bandwidth {bandwidth / 1e9:.1f} GB/s (best of {len(bandwidths)}); weights "
          f"{weights / 1e9:.3f} GB ({dtype}), KV {kv_ours / 1e3:.1f} / {kv_theirs / 1e3:.1f} kB a "
          f"token (ours / vLLM); same text: "
          f"{same}/{len(answers[ours])} prompts")  # fmt: skip
    print(
        "| concurrency | speclens serve tok/s | vLLM tok/s | AL ours / vLLM | ours / vLLM (median) "
        "| per round | of bound: ours / vLLM |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c in args.concurrency:
        ratios = [a / b for a, b in zip(rates[ours][c], rates[theirs][c], strict=True)]
        step = median(x for x in per_step[ours][c] if x) if any(per_step[ours][c]) else 1.0
        shares = [
            median(x / (b * bandwidth * step)
                   for x, b in zip(rates[s][c], bounds[s][c], strict=True))
            for s in (ours, theirs)
        ]  # fmt: skip
        print(
            f"| {c} | {median(rates[ours][c]):.1f} | {median(rates[theirs][c]):.1f} "
            f"| {median(als[ours][c]):.2f} / {median(als[theirs][c]):.2f} | {median(ratios):.2f} "
            f"| {min(ratios):.2f}-{max(ratios):.2f} | {shares[0]:.2f} / {shares[1]:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
