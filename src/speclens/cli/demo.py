"""``speclens demo``: the main job, on the embedded default, with no server to start by hand.

Resolve a golden AL from the shipped registry (Kimi-K3 with DSpark at K = 7, thinking on,
coding: 3.78), start ``speclens serve`` with that schedule forced on the embedded dummy target
and drafter, load it with ``speclens bench``, verify the run hit the target (histogram and AL),
print the report and where the files are, and stop the server. Exit codes follow ``speclens
bench``: 1 when verification fails, 2 bad options, 3 too many failed requests, 4 inconclusive,
130 interrupted.

``--spread`` replays the profile's measured spread between requests too: each request draws its
own AL from it, and the verdict checks the per-request ALs against it. Golden curves publish
none, so with the default profile ``--spread`` takes the shipped one that states a spread
(``SPREAD_PROFILE``: SmolLM2 with n-gram drafting on Spec-Bench, K 4).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import typer
import yaml

from speclens.acceptance import Registry, WorkloadAcceptance, conditional_rates, resolve
from speclens.cli._common import fail, num_spec_tokens_callback, out_console, reported
from speclens.cli.bench import check, load_settings, open_records, prompts_digest, range_problem
from speclens.cli.profiles import print_resolution

#: The default profile's key fields, and the shipped profile ``--spread`` takes in their place.
DEFAULT_PROFILE = ("kimi-k3", "dspark", 7, "on", "coding")
SPREAD_PROFILE = ("smollm2-135m-instruct", "ngram", 4, "off", "spec-bench")
#: Requests by default, and with ``--spread``: its check resolves a total variation of 0.3 at
#: 60 to 71 requests (``runs.verify``), so 64 would often be inconclusive.
DEFAULT_REQUESTS, SPREAD_REQUESTS = 64, 128


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s")


def demo(
    model: str = typer.Option(
        "kimi-k3", "--model", help="The catalog model whose golden AL to replay."
    ),
    method: str = typer.Option(
        "dspark", "--method", help="Its speculative method in the registry."
    ),
    num_spec_tokens: int = typer.Option(
        7, "--num-spec-tokens", "-k", help="K.", callback=num_spec_tokens_callback
    ),
    thinking: str = typer.Option("on", "--thinking", help="Thinking mode, on or off."),
    category: str = typer.Option("coding", "--category", help="Workload category."),
    num_requests: int = typer.Option(
        DEFAULT_REQUESTS, "--num-requests", help="Requests the benchmark sends."
    ),
    concurrency: int = typer.Option(16, "--concurrency"),
    max_tokens: int = typer.Option(128, "--max-tokens"),
    executor: str = typer.Option("torch", "--executor", help="torch (real forward passes) or sim."),
    output_dir: Path = typer.Option(
        Path("runs/demo"), "--output-dir", help="Where the report files go."
    ),
    spread: bool = typer.Option(
        False,
        "--spread",
        help="Replay the profile's measured spread between requests too (the default profile "
        "then: SmolLM2 n-gram on Spec-Bench, K 4, which states one; the default --num-requests "
        f"then {SPREAD_REQUESTS}, as the spread check needs about 70).",
    ),
) -> None:
    """Replay a golden AL end to end: resolve, serve it forced, benchmark, verify."""
    from speclens.bench.client import LoadConfig
    from speclens.bench.datasets import random_prompts
    from speclens.bench.run import Expectation, run_bench
    from speclens.runs.report import print_summary, write_files

    check([
        range_problem("--num-spec-tokens", num_spec_tokens, 1),
        range_problem("--num-requests", num_requests, 1),
        range_problem("--concurrency", concurrency, 1),
        range_problem("--max-tokens", max_tokens, 1),
    ])  # fmt: skip
    if spread and (model, method, num_spec_tokens, thinking, category) == DEFAULT_PROFILE:
        model, method, num_spec_tokens, thinking, category = SPREAD_PROFILE
    if spread and num_requests == DEFAULT_REQUESTS:
        num_requests = SPREAD_REQUESTS
    with reported():
        registry = Registry.load()
        res = resolve(
            model=model, method=method, num_spec_tokens=num_spec_tokens, registry=registry,
            workload=WorkloadAcceptance.model_validate({"thinking": thinking, "category": category}),
        )  # fmt: skip
    out_console.rule(
        f"1. Resolve: {model} / {method} / K {num_spec_tokens} / thinking {thinking} / {category}"
    )
    print_resolution(res)
    out_console.print(
        f"conditional rates the sampler draws against: {conditional_rates(res.per_position_rates)}"
    )
    if spread and res.spread is None:
        fail(f"demo: --spread: the profile {res.profile} states no spread between requests; "
             "choose one that does (profiles from-run writes one from a natural run)", code=2)  # fmt: skip

    out_console.rule("2. Serve it forced (embedded dummy target and drafter)")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    spec = {
        "method": "draft_model",
        "num_speculative_tokens": num_spec_tokens,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": res.per_position_rates,
    }
    command = [
        sys.executable, "-m", "speclens", "serve", "--speculative-config", json.dumps(spec),
        "--per-request-spec-decode-stats", "detailed", "--executor", executor,
        "--max-num-seqs", str(max(concurrency, 1)), "--port", str(port),
    ]  # fmt: skip
    records_out = open_records(output_dir)  # creates output_dir; exit 2 when it cannot
    if spread and res.spread is not None:
        spread_file = output_dir / "spread.yaml"
        spread_file.write_text(
            yaml.safe_dump(res.spread.model_dump(exclude_none=True), sort_keys=False)
        )
        command += ["--spec-decode-acceptance-spread", str(spread_file)]
    log_path = output_dir / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            _wait_healthy(url, proc)
        except RuntimeError as exc:
            fail([f"demo: {exc}", *log_path.read_text(errors="replace").splitlines()[-20:]])
        for line in log_path.read_text(errors="replace").splitlines():
            if "Forced speculative acceptance ON" in line:
                out_console.print(line.split(": ", 1)[-1], markup=False)
        out_console.print(f"serving on {url} (log: {log_path})")

        out_console.rule("3. Benchmark and verify")
        config = LoadConfig(
            url=url, model="dummy", num_requests=num_requests, concurrency=concurrency,
            max_tokens=max_tokens, ignore_eos=True, warmup=min(4, num_requests),
        )  # fmt: skip
        from speclens.bench.host import host_load
        from speclens.runs.rundir import SETTINGS_SCHEMA

        prompts = random_prompts(num_requests + 4, 32, max_tokens, seed=0)
        expectation = Expectation(
            res.acceptance_length, num_spec_tokens, res.model_dump(),
            spread=res.spread if spread else None,
        )  # fmt: skip
        settings = {
            **load_settings(config),  # what the report's Settings table shows
            "dataset": "random", "dataset_path": None, "categories": None, "slo": None,
            "backend_requested": config.backend, "backend_evidence": "speclens serve, started here",
            "max_failure_rate": 0.0, "num_speculative_tokens": num_spec_tokens, "workers": 1,
            "shard": None, "prompts_sha256": prompts_digest(prompts),
            "demo": True, "resolution": res.model_dump(), "server_command": command[3:],
            "host": host_load(), "acceptance_source": (res.source or "")[:256] or None,
            "acceptance_profile": res.profile, "settings_schema": SETTINGS_SCHEMA,
        }  # fmt: skip
        with records_out:
            outcome = asyncio.run(
                run_bench(
                    config, prompts, expectation, on_done=records_out.write, settings=settings
                )
            )
        try:
            with urllib.request.urlopen(url + "/debug/mtp_stats", timeout=5) as resp:
                mtp = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            mtp = {"unreadable": str(exc)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    print_summary(out_console, outcome.summary)
    out_console.print(f"server /debug/mtp_stats: {json.dumps(mtp)}", markup=False)
    out_console.rule("4. Files")
    for path in [records_out.path, *write_files(output_dir, outcome.summary, outcome.records)]:
        out_console.print(f"  {path}")
    out_console.print(f"  {log_path}")
    if records_out.error:
        fail(f"{records_out.error}: records.jsonl is incomplete")
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)
