"""Observe, calibrate, replay: how well a step cost fitted on observed runs predicts a held-out one.

The flow of the issue's "Done means", on ``speclens serve --model smollm2 --method ngram
--num-speculative-tokens 4`` (prompt lookup 2..4): bench on Spec-Bench at concurrency 1 (12
requests) and 4 (24), 64 tokens, ignore-eos; ``speclens calibrate c1 c4 -o cost.yaml``; a held-out
run at concurrency 8 (32 requests); ``speclens sim --trace c8 --step-cost cost.yaml``; then
``speclens compare c8 sim8``'s fidelity (per-request median and P90 error of E2E, TTFT, TPOT, and
the throughput error). Beside it, the machine's own noise: a second identical held-out run
compared with the first the same way. Goal: median E2E error and throughput error within 10%, or
within 3 points of that noise where the machine is noisier.

Then each run's speed (one step cost's shape fitted on the chunks of all the runs together,
with a factor per run: 1 the runs' mean, weighted by steps; above 1 slower), and each run's
decode steps over the linear fit's price (1 in the calibration runs; a held-out run's figure is
where the engine's step leaves the fit's line, and that run's speed).

    python benchmarks/replay.py [--engine speclens|vllm] [--model smollm2] [--keep DIR]
                                [--roofline smollm2-135m]

Held out besides: a run at concurrency 2 (16 requests) and an open-loop Poisson run at 1.5
requests/s (24), each replayed from its own trace. ``--engine vllm`` runs the same against vLLM's
CPU build (the peer tier's environment) on SmolLM2 exported as speclens runs it, ``--engine
llamacpp`` against llama-server (the peer tier's build) on SmolLM2's GGUF with n-gram drafting
(``--spec-type ngram-simple``, lookup 2, K 4).
``--roofline MODEL`` fits the roofline too (``calibrate --model MODEL --hardware host.yaml``,
this machine measured by ``calibrate --host``) and replays the held-out runs with it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The peer tier's vLLM environment and llama.cpp build.
from peers import export_smollm2, free_port, launch, llamacpp_env, vllm_env

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = REPO_ROOT / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
GOAL, MARGIN = 0.10, 0.03


def speclens(*args: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "speclens", *map(str, args)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode not in (0, 1):
        raise RuntimeError(f"speclens {args[0]} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def fidelity(a: Path, b: Path) -> dict[str, Any]:
    done = speclens("compare", a, b, "--json")
    (pair,) = json.loads(done.stdout)["pairs"]
    result: dict[str, Any] = pair["fidelity"]
    return result


def row(name: str, f: dict[str, Any]) -> str:
    figures = f["figures"]
    cells = [
        f"{figures[k]['median_ape']:.1%} / {figures[k]['p90_ape']:.1%}"
        for k in ("e2e", "ttft", "tpot")
    ]
    return f"| {name} | {' | '.join(cells)} | {figures['e2e']['bias']:+.1%} | {f['throughput_error']:+.1%} |"


def command(engine: str, model: str, port: int, work: Path) -> tuple[list[str], dict[str, str]]:
    """The server under test on ``port`` and its environment: speclens serve, vLLM's CPU build
    (the peer tier's environment) on SmolLM2 exported as speclens runs it, or llama-server;
    n-gram K 4, prompt lookup 2..4."""
    if engine == "vllm":
        if not vllm_env.ready():
            raise RuntimeError("the vLLM environment is not built: python tests/peers/vllm_env.py")
        exported = work / "smollm2-hf"
        if not exported.exists():
            export_smollm2(exported)
        return vllm_env.command(exported, port, vllm_env.NGRAM), vllm_env.environment()
    if engine == "llamacpp":
        from speclens.engine.weights_gguf import smollm2_gguf_path

        if not llamacpp_env.ready():
            raise RuntimeError("llama.cpp is not built: python tests/peers/llamacpp_env.py")
        return llamacpp_env.command(smollm2_gguf_path(), port, llamacpp_env.NGRAM), dict(os.environ)
    cmd = [sys.executable, "-m", "speclens", "serve", "--model", model, "--method", "ngram",
           "--num-speculative-tokens", "4", "--per-request-spec-decode-stats", "summary",
           "--speculative-config", '{"prompt_lookup_min": 2, "prompt_lookup_max": 4}',
           "--port", str(port)]  # fmt: skip
    return cmd, dict(os.environ)


#: (name, load flags, requests): the two calibration runs, then the held-out ones; c8b repeats
#: c8 right after it (the machine's noise).
RUNS = [("c1", ["--concurrency", "1"], 12), ("c4", ["--concurrency", "4"], 24),
        ("c2", ["--concurrency", "2"], 16), ("c8", ["--concurrency", "8"], 32),
        ("c8b", ["--concurrency", "8"], 32), ("rate", ["--request-rate", "1.5"], 24)]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["speclens", "vllm", "llamacpp"], default="speclens")
    parser.add_argument("--model", default="smollm2", help="speclens serve's --model")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--keep", type=Path, help="keep the runs here (default: a temporary dir)")
    parser.add_argument(
        "--roofline",
        metavar="MODEL",
        help="also fit a roofline of this catalog model on this machine",
    )
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: calibrate and replay the runs already there, no server")  # fmt: skip
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="speclens-replay-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}; {args.engine}, model {args.model}; files in "
          f"{work}", flush=True)  # fmt: skip
    port = free_port()
    served = "smollm2" if args.engine in ("vllm", "llamacpp") else args.model
    load = ["--model", served, "--max-tokens", str(args.max_tokens), "--ignore-eos",
            "--stream", "--warmup", "1"]  # fmt: skip
    load += ["--dataset", "jsonl", "--dataset-path", str(SPEC_BENCH)] if args.model != "dummy" else ["--dataset", "random"]  # fmt: skip
    if args.engine == "llamacpp":  # llama-server reports no K: its draft size, stated
        load += ["--num-spec-tokens", "4"]
    if args.reuse and args.keep:
        print("reusing the runs already there", flush=True)
    else:
        bench_all(args, work, port, load)
    calibrate_and_replay(work, "cost.yaml", "linear")
    samples = clean_chunks(work)
    speeds(samples)
    against_fit(samples, work / "cost.yaml")
    if args.roofline:
        done = speclens("calibrate", "--host", "-o", work / "host.yaml")
        print(done.stdout + done.stderr)
        calibrate_and_replay(work, "roofline.yaml", "roofline", "--model", args.roofline,
                             "--hardware", work / "host.yaml", "--method", "ngram")  # fmt: skip
    return 0


def bench_all(args: argparse.Namespace, work: Path, port: int, load: list[str]) -> None:
    cmd, env = command(args.engine, args.model, port, work)
    with launch.running(args.engine, cmd, port, work / "server.log", 600, env) as url:
        for name, flags, count in RUNS:
            started = time.monotonic()
            speclens("bench", "--url", url, *load, *flags, "--num-requests", count,
                     "--output-dir", work / name)  # fmt: skip
            print(f"  {name}: {time.monotonic() - started:.0f} s", flush=True)


def clean_chunks(work: Path) -> dict[str, Any]:
    """Each run's sample as calibrate reads it (``_Sample``: its decode rows over the chunks no
    prefill ran in are ``clean_x``, ``clean_y``), read once for both diagnostics below."""
    from speclens.sim import calibrate as cal

    return {name: cal._gather([cal.observe(work / name)])
            for name, _, _ in RUNS if (work / name).is_dir()}  # fmt: skip


def speeds(samples: dict[str, Any]) -> None:
    """Each run's speed: one shape (base, per request, per context token) fitted on every run's
    chunks no prefill ran in (as calibrate's decode prices are), with a factor per run, by
    alternating least squares; 1 is the runs' mean (geometric, weighted by steps)."""
    import numpy as np

    from speclens.cost import _nonnegative_lstsq

    parts = list(samples.values())
    x = np.vstack([s.clean_x for s in parts])
    y = np.concatenate([s.clean_y for s in parts])
    run = np.concatenate([np.full(len(s.clean_y), i) for i, s in enumerate(parts)])
    steps = np.array([s.clean_x[:, 0].sum() for s in parts])
    factor = np.ones(len(parts))
    for _ in range(50):
        shape = np.array(_nonnegative_lstsq(x * factor[run][:, None], y))
        priced = x @ shape
        factor = np.array([y[run == i] @ priced[run == i] / max(priced[run == i] @ priced[run == i], 1e-12)
                           if (run == i).any() else 1.0 for i in range(len(parts))])  # fmt: skip
        factor /= np.exp(steps @ np.log(factor) / steps.sum())
    print(f"each run's speed (one shape: {shape[0] * 1e3:.1f} ms + {shape[1] * 1e3:.2f} ms a request "
          f"+ {shape[2] * 1e6:.1f} us a context token; above 1 slower): "
          + ", ".join(f"{name} {f:.3f}" for name, f in zip(samples, factor, strict=True)))  # fmt: skip


def against_fit(samples: dict[str, Any], cost: Path) -> None:
    """Each run's decode steps in the chunks no prefill ran in, over the fit's price for them
    (summed): 1 in the calibration runs; a held-out run's figure shows where the step's price
    leaves the fit's line through them (and the machine's speed that run)."""
    import numpy as np

    from speclens.cost import StepCost
    from speclens.sim import calibrate as cal

    fitted, _ = cal.read_cost_file(cost)
    assert isinstance(fitted, StepCost)
    prices = np.array([fitted.base, fitted.per_seq, fitted.per_context_token])
    cells = []
    for name, sample in samples.items():
        x, y = sample.clean_x, sample.clean_y
        width = x[:, 1].sum() / x[:, 0].sum()
        cells.append(f"{name} (batch {width:.1f}) {y.sum() / (x @ prices).sum():.3f}")
    print("decode steps over the linear fit's price: " + ", ".join(cells))


def calibrate_and_replay(work: Path, cost: str, kind: str, *flags: str | Path) -> None:
    done = speclens("calibrate", work / "c1", work / "c4", "-o", work / cost, *flags)
    print(done.stdout + done.stderr)
    print(
        "| against the observed run | E2E median / P90 | TTFT median / P90 | TPOT median / P90 | E2E bias | throughput |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    results = {}
    for name in ("c2", "c8", "rate"):
        out = work / f"sim-{kind}-{name}"
        done = speclens("sim", "--trace", work / name, "--step-cost", work / cost,
                        "--output-dir", out)  # fmt: skip
        results[name] = fidelity(work / name, out)
        print(row(f"{kind} replay of {name}", results[name]))
    noise = fidelity(work / "c8", work / "c8b")
    print(row("noise: c8b against c8", noise))
    replay = results["c8"]
    for key, name in (("e2e", "median E2E error"), ("throughput", "throughput error")):
        value = (
            replay["figures"]["e2e"]["median_ape"]
            if key == "e2e"
            else abs(replay["throughput_error"])
        )
        floor = (
            noise["figures"]["e2e"]["median_ape"]
            if key == "e2e"
            else abs(noise["throughput_error"])
        )
        bound = max(GOAL, floor + MARGIN)
        print(
            f"{kind} c8 {name}: {value:.1%} against a bound of {bound:.1%} ({'met' if value <= bound else 'NOT met'})"
        )


if __name__ == "__main__":
    sys.exit(main())
