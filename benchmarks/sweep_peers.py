"""``speclens sweep`` against ``speclens serve`` and vLLM's CPU build, then ``speclens compare``.

The peer tier's sweep test (``tests/peers/test_sweep_vllm.py``) as a benchmark: both servers load
the same exported SmolLM2-135M-Instruct in float32 with n-gram speculation K 4 (prompt lookup
2..4); one ``speclens sweep`` each over ``--concurrency`` with ``--rounds``, the same Spec-Bench
rows (spread over the file), completions, greedy, ``--max-tokens``, ignore-eos. Only one server
runs at a time (they would share two cores, and vLLM's worker busy-polls one). Prints compare's
checks, the table at matched concurrency with 95% intervals, the sentences at matched
interactivity, and draws both Pareto curves (output tok/s against tok/s per user, with the
intervals as bars) to ``--png``.

    python benchmarks/sweep_peers.py [--prompts 8] [--max-tokens 64] [--concurrency 1,4]
        [--rounds 2] [--png benchmarks/sweep_vllm_pareto.png]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peers import free_port, launch, prepare, speclens_command, vllm_env

STARTUP_TIMEOUT_S = 480.0


def speclens(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "speclens", *map(str, args)],
                          capture_output=True, text=True, check=False)  # fmt: skip


def sweep(url: str, prompts: Path, args: argparse.Namespace, out: Path) -> None:
    done = speclens(
        "sweep", "--url", url, "--model", vllm_env.SERVED_MODEL, "--endpoint", "completions",
        "--dataset", "jsonl", "--dataset-path", prompts, "--num-requests", args.prompts,
        "--concurrency", args.concurrency, "--rounds", args.rounds, "--max-tokens",
        args.max_tokens, "--temperature", "0", "--ignore-eos", "--warmup", "1", "--output-dir", out,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"speclens sweep exited {done.returncode}:\n{done.stdout[-2000:]}")


def show(interval: dict[str, Any], digits: int = 1) -> str:
    if interval.get("low") is None:
        return f"{interval['mean']:.{digits}f}"
    return f"{interval['mean']:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def pareto_png(sweeps: dict[str, Path], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, root in sweeps.items():
        stats = sorted(json.loads((root / "sweep.json").read_text())["stats"],
                       key=lambda s: s["settings"]["concurrency"])  # fmt: skip
        xs = [s["figures"]["tokens_per_s_per_user"] for s in stats]
        ys = [s["figures"]["output_tokens_per_s"] for s in stats]
        ax.errorbar(
            [x["mean"] for x in xs], [y["mean"] for y in ys],
            xerr=[[x["mean"] - x["low"] for x in xs], [x["high"] - x["mean"] for x in xs]],
            yerr=[[y["mean"] - y["low"] for y in ys], [y["high"] - y["mean"] for y in ys]],
            marker="o", capsize=3, label=name,
        )  # fmt: skip
        for s, x, y in zip(stats, xs, ys, strict=True):
            ax.annotate(f"c{s['settings']['concurrency']}", (x["mean"], y["mean"]),
                        textcoords="offset points", xytext=(5, 5), fontsize=8)  # fmt: skip
    ax.set_xlabel("tokens/s per user (1 / TPOT)")
    ax.set_ylabel("output tokens/s (one 2-core CPU machine)")
    ax.set_title("SmolLM2-135M, n-gram K 4, Spec-Bench: 95% CI over rounds")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--png", type=Path, default=Path(__file__).with_name("sweep_vllm_pareto.png")
    )
    parser.add_argument("--model-dir", type=Path, help="an exported SmolLM2 (skips the export)")
    args = parser.parse_args()
    prepared = prepare(args, "speclens-sweep-peers-")
    if prepared is None:
        return 1
    work, model_dir, prompts = prepared
    servers = {
        "speclens": (speclens_command, dict(os.environ)),
        "vllm": (lambda d, p: vllm_env.command(d, p, vllm_env.NGRAM), vllm_env.environment()),
    }
    sweeps = {}
    for name, (make_cmd, env) in servers.items():
        port, started = free_port(), time.monotonic()
        with launch.running(name, make_cmd(model_dir, port), port, work / f"{name}.log",
                            STARTUP_TIMEOUT_S, env) as url:  # fmt: skip
            print(f"  {name} ready in {time.monotonic() - started:.0f} s", flush=True)
            sweeps[name] = work / f"sweep-{name}"
            sweep(url, prompts, args, sweeps[name])
    done = speclens("compare", sweeps["vllm"], sweeps["speclens"], "--label", "vllm", "--label",
                    "speclens", "--json", "--output-dir", work / "compare")  # fmt: skip
    if done.returncode not in (0, 1):
        raise RuntimeError(f"speclens compare exited {done.returncode}:\n{done.stderr[-2000:]}")
    (pair,) = json.loads(done.stdout)["pairs"]
    print(f"\n{pair['label']} (files in {work})")
    for check in pair["checks"]:
        print(f"- {check['name']}: {'ok' if check['ok'] else 'FAIL'}: {check['detail']}")
    print("\n| concurrency | figure | vLLM | speclens | speclens / vLLM |")
    print("|---:|---|---:|---:|---:|")
    for row in pair["deltas"]["matched_concurrency"]:
        print(f"| {row['concurrency']} | {row['figure']} | {show(row['a'])} | {show(row['b'])} "
              f"| {row['ratio']:.2f} [{row['ratio_low']:.2f}, {row['ratio_high']:.2f}] |")  # fmt: skip
    print()
    for row in pair["deltas"]["matched_interactivity"]:
        print(f"- {row['sentence']}")
    print(f"- {pair['deltas']['interactivity_note']}")
    pareto_png(sweeps, args.png)
    print(f"\nPareto curves: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
