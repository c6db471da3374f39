"""Honest tails: does a measured spread between requests make the simulator's and the forced
server's latency tails match a natural run's?

On SmolLM2-135M-Instruct with n-gram drafting (K 4, prompt lookup 2..4), greedy, ``--max-tokens``
tokens with ignore-eos, on Spec-Bench's 13 categories (category round robin):

1. natural runs at concurrency 1 and 2 (``--requests`` each), on ``speclens serve`` or vLLM's
   CPU build (``--engine vllm``, the peer tier's environment);
2. ``speclens profiles from-run`` writes the measured profile with its spread (every request
   pooled into one ``spec-bench`` profile; greedy on the same prompts, each request accepts the
   same at either concurrency);
3. ``speclens calibrate`` fits a step cost on the two runs;
4. ``speclens sim`` of each run's workload (its concurrency, each request's prompt length drawn
   from the run's own, ``--sim-requests`` requests) with (a) the profile's mean alone and (b)
   its spread; TPOT p50, p90, p99 and E2E p90 against the natural run's. Goal: with the spread,
   TPOT p90 within 10% of the natural run's, and at most half the mean-only error. At
   concurrency 1 the tails are acceptance's alone; at 2 another request's prefill stalls a
   decode, which both predictions price;
5. (``--engine speclens`` only) ``speclens serve`` on the same model forced at the profile's AL
   with its spread and its draft coverage (``--spec-decode-draft-coverage``), loaded the same
   way with ``--expect-acceptance-spread``: the verdict, a two-sample Kolmogorov-Smirnov test of
   the per-request ALs against the natural run's (each request weighted by its verify steps, the
   spread's own measure; the effective sizes (Σw)² / Σw² in its p), and the TPOT p90 against the
   natural run's.

    python benchmarks/spread.py [--engine speclens|vllm] [--requests 104] [--max-tokens 64]
                                [--keep DIR] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from peers import export_smollm2, free_port, launch, vllm_env

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = REPO_ROOT / ".." / "shared" / "data" / "spec-bench" / "question.jsonl"
GOAL = 0.10
NGRAM = '{"prompt_lookup_min": 2, "prompt_lookup_max": 4}'


def speclens(*args: str | Path, ok: tuple[int, ...] = (0, 1)) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "speclens", *map(str, args)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode not in ok:
        raise RuntimeError(f"speclens {args[0]} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def serve_command(
    engine: str, port: int, work: Path, *forcing: str
) -> tuple[list[str], dict[str, str]]:
    if engine == "vllm":
        if not vllm_env.ready():
            raise RuntimeError("the vLLM environment is not built: python tests/peers/vllm_env.py")
        exported = work / "smollm2-hf"
        if not exported.exists():
            export_smollm2(exported)
        return vllm_env.command(exported, port, vllm_env.NGRAM), vllm_env.environment()
    cmd = [sys.executable, "-m", "speclens", "serve", "--model", "smollm2", "--method", "ngram",
           "--num-speculative-tokens", "4", "--per-request-spec-decode-stats", "summary",
           "--speculative-config", NGRAM, "--port", str(port), *forcing]  # fmt: skip
    return cmd, dict(os.environ)


def bench(url: str, out: Path, concurrency: int, requests: int, max_tokens: int,
          *extra: str | Path) -> None:  # fmt: skip
    started = time.monotonic()
    speclens("bench", "--url", url, "--model", "smollm2", "--max-tokens", max_tokens,
             "--ignore-eos", "--stream", "--warmup", "1", "--dataset", "jsonl", "--dataset-path",
             SPEC_BENCH, "--concurrency", concurrency, "--num-requests", requests,
             "--output-dir", out, *extra)  # fmt: skip
    print(f"  {out.name}: {time.monotonic() - started:.0f} s", flush=True)


def tails(run: Path) -> dict[str, float]:
    latency = json.loads((run / "summary.json").read_text())["figures"]["latency_ms"]
    return {"tpot_p50": latency["tpot"]["p50"], "tpot_p90": latency["tpot"]["p90"],
            "tpot_p99": latency["tpot"]["p99"], "e2e_p90": latency["e2e"]["p90"]}  # fmt: skip


def request_als(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """Each measured request's realized AL and its verify steps (requests with a verify step)."""
    als, steps = [], []
    for line in (run / "records.jsonl").read_text().splitlines():
        row = json.loads(line)
        spec = row.get("spec_decode_acceptance") or {}
        if row.get("warmup") or not spec.get("num_spec_steps"):
            continue
        als.append(1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"])
        steps.append(spec["num_spec_steps"])
    return np.array(als), np.array(steps, dtype=float)


def weighted_ks(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[float, float, float, float]:  # fmt: skip
    """Two-sample Kolmogorov-Smirnov between step-weighted samples: D, its asymptotic p at the
    effective sizes, and the two effective sizes."""
    from scipy import stats

    def cdf(sample: tuple[np.ndarray, np.ndarray], at: np.ndarray) -> np.ndarray:
        values, weights = sample
        order = np.argsort(values)
        cumulative = np.cumsum(weights[order]) / weights.sum()
        return np.concatenate([[0.0], cumulative])[np.searchsorted(values[order], at, side="right")]

    grid = np.union1d(a[0], b[0])
    d = float(np.abs(cdf(a, grid) - cdf(b, grid)).max())
    n_a, n_b = (float(w.sum() ** 2 / (w**2).sum()) for _, w in (a, b))
    p = float(stats.kstwobign.sf(d * np.sqrt(n_a * n_b / (n_a + n_b))))
    return d, p, n_a, n_b


def derived_coverage(run: Path) -> float:
    """Draft coverage from the records of an engine that reports no decode steps (vLLM): a
    request's decode steps are its completion tokens less the first and the accepted drafts."""
    steps = decode = 0
    for line in (run / "records.jsonl").read_text().splitlines():
        row = json.loads(line)
        spec = row.get("spec_decode_acceptance") or {}
        if row.get("warmup") or spec.get("num_spec_steps") is None:
            continue
        steps += spec["num_spec_steps"]
        decode += row["completion_tokens"] - 1 - spec["num_accepted_draft_tokens"]
    return round(steps / decode, 4)


def prompt_lengths(run: Path) -> list[int]:
    """The natural run's prompt lengths, which the scenario draws from (``values``): Spec-Bench's
    prompts are skewed, and a prefill stalls the batch's decodes in proportion to its tokens."""
    return [json.loads(line)["prompt_tokens"]
            for line in (run / "records.jsonl").read_text().splitlines()]  # fmt: skip


def scenario(work: Path, profile: dict[str, Any], spread: bool, lengths: list[int],
             max_tokens: int, requests: int, concurrency: int) -> Path:  # fmt: skip
    value: dict[str, Any] = {
        "num_spec_tokens": 4, "acceptance_length": profile["acceptance_length"],
        "source": "the natural run's measured profile",
    }  # fmt: skip
    if profile.get("draft_coverage") is not None:
        value["draft_coverage"] = profile["draft_coverage"]
    if spread:
        value["spread"] = profile["spread"]
    doc = {
        "model": "smollm2-135m",
        "deployment": {"pools": [{"role": "mixed", "parallel": 1,
                                  "step_cost_file": str(work / "cost.yaml"),
                                  "engine": {"speculative": {"method": "ngram",
                                                             "num_spec_tokens": 4},
                                             "max_num_seqs": concurrency,
                                             "max_model_len": 4096}}]},
        "workload": {"input_tokens": {"values": lengths},
                     "output_tokens": max_tokens, "concurrency": concurrency, "requests": requests,
                     "acceptance": value},
    }  # fmt: skip
    path = work / f"scenario-c{concurrency}-{'spread' if spread else 'mean'}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


CONCURRENCIES = (1, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["speclens", "vllm"], default="speclens")
    parser.add_argument("--requests", type=int, default=104, help="each natural run's requests")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--sim-requests", type=int, default=4000)
    parser.add_argument("--keep", type=Path, help="keep the runs here (default: a temporary dir)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --keep: use the natural runs already there")  # fmt: skip
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="speclens-spread-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}; {args.engine}; files in {work}", flush=True)  # fmt: skip
    natural = {c: work / f"natural-c{c}" for c in CONCURRENCIES}
    if not (args.reuse and all(run.is_dir() for run in natural.values())):
        port = free_port()
        cmd, env = serve_command(args.engine, port, work)
        with launch.running(args.engine, cmd, port, work / "server.log", 600, env) as url:
            for c, run in natural.items():
                bench(url, run, c, args.requests, args.max_tokens)
    # greedy, the same prompts: each request's acceptance is the same at either concurrency
    speclens("profiles", "from-run", natural[1], "--category", "spec-bench", "--method", "ngram",
             "--num-spec-tokens", "4", "--hardware", f"cpu-{platform.machine()}",
             "-o", work / "profile.yaml")  # fmt: skip
    (profile,) = yaml.safe_load((work / "profile.yaml").read_text())["profiles"]
    if not profile.get("spread"):
        raise RuntimeError("the natural run's profile states no spread")
    (work / "spread.yaml").write_text(yaml.safe_dump(profile["spread"], sort_keys=False))
    if profile.get("draft_coverage") is None:  # the engine reports no decode steps
        profile["draft_coverage"] = derived_coverage(natural[1])
        print(f"draft coverage {profile['draft_coverage']}: derived from completion tokens "
              "(the engine reports no decode steps)")  # fmt: skip
    print(f"profile: AL {profile['acceptance_length']}, coverage {profile.get('draft_coverage')}, "
          f"spread {profile['spread']['quantiles']} over {profile['spread']['requests']} requests")  # fmt: skip
    done = speclens("calibrate", *natural.values(), "-o", work / "cost.yaml")
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:])
    rows: dict[tuple[int, str], dict[str, float]] = {}
    for c, run in natural.items():
        rows[c, "natural run"] = tails(run)
        for spread in (False, True):
            out = work / f"sim-c{c}-{'spread' if spread else 'mean'}"
            doc = scenario(work, profile, spread, prompt_lengths(run), args.max_tokens,
                           args.sim_requests, c)  # fmt: skip
            speclens("sim", doc, "--output-dir", out)
            rows[c, f"sim, {'spread' if spread else 'mean only'}"] = tails(out)
    verdicts = {}
    if args.engine == "speclens":
        al = str(profile["acceptance_length"])
        coverage = str(profile.get("draft_coverage") or 1.0)
        port = free_port()
        cmd, env = serve_command(args.engine, port, work, "--spec-decode-acceptance-length", al,
                                 "--spec-decode-acceptance-spread", str(work / "spread.yaml"),
                                 "--spec-decode-draft-coverage", coverage)  # fmt: skip
        with launch.running("forced", cmd, port, work / "forced.log", 600, env) as url:
            for c in CONCURRENCIES:
                forced = work / f"forced-c{c}"
                if forced.exists():
                    shutil.rmtree(forced)  # --reuse: the forced runs are run again
                bench(url, forced, c, args.requests, args.max_tokens,
                      "--expect-acceptance-length", al, "--expect-acceptance-spread",
                      work / "spread.yaml")  # fmt: skip
                rows[c, "serve, forced with the spread"] = tails(forced)
                verdicts[c] = json.loads((forced / "summary.json").read_text()).get("verdict")
    report(rows, natural, work, verdicts)
    return 0


def report(rows: dict[tuple[int, str], dict[str, float]], natural: dict[int, Path], work: Path,
           verdicts: dict[int, dict[str, Any] | None]) -> None:  # fmt: skip
    keys = ("tpot_p50", "tpot_p90", "tpot_p99", "e2e_p90")
    print("\n| concurrency | against the natural run | TPOT p50 | TPOT p90 | TPOT p99 | E2E p90 |")
    print("|---:|---|---:|---:|---:|---:|")
    for (c, name), row in rows.items():
        measured = rows[c, "natural run"]
        cells = [f"{row[k]:.1f} ms" + ("" if name == "natural run" else
                 f" ({error(row[k], measured[k]):+.1%})") for k in keys]  # fmt: skip
        print(f"| {c} | {name} | {' | '.join(cells)} |")
    for c in CONCURRENCIES:
        measured = rows[c, "natural run"]["tpot_p90"]
        mean_err = abs(error(rows[c, "sim, mean only"]["tpot_p90"], measured))
        spread_err = abs(error(rows[c, "sim, spread"]["tpot_p90"], measured))
        met = spread_err <= GOAL and spread_err <= mean_err / 2
        print(f"concurrency {c}: sim TPOT p90 error with the spread {spread_err:.1%}, mean only "
              f"{mean_err:.1%}; goal within {GOAL:.0%} and at most half the mean-only error: "
              f"{'met' if met else 'NOT met'}")  # fmt: skip
        forced = work / f"forced-c{c}"
        if not forced.is_dir():
            continue
        d, p, n_a, n_b = weighted_ks(request_als(natural[c]), request_als(forced))
        forced_err = error(rows[c, "serve, forced with the spread"]["tpot_p90"], measured)
        print(f"  forced against natural: per-request AL (step-weighted) KS D {d:.3f}, p {p:.3f} "
              f"(effective sizes {n_b:.0f} and {n_a:.0f}; {'passes' if p >= 0.01 else 'FAILS'} "
              f"at 0.01); TPOT p90 {forced_err:+.1%} "
              f"({'within' if abs(forced_err) <= GOAL else 'NOT within'} {GOAL:.0%})")  # fmt: skip
        if verdicts.get(c):
            print(f"  bench verdict with the spread: {verdicts[c].get('reason')}")


if __name__ == "__main__":
    sys.exit(main())
