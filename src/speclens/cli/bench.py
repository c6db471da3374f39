"""``speclens bench``: load an OpenAI-compatible server, measure speculative decoding request by
request, and judge the run against the acceptance it was supposed to hit."""

from __future__ import annotations

import asyncio
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from speclens.cli._common import (
    REGISTRY_OPTION,
    err_console,
    fail,
    load_registry,
    out_console,
    reported,
)


class EndpointChoice(StrEnum):
    completions = "completions"
    chat = "chat"


def bench(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="The server's base URL."),
    api_key: str | None = typer.Option(None, "--api-key"),
    model: str = typer.Option(..., "--model", help="The served model name."),
    endpoint: EndpointChoice = typer.Option(EndpointChoice.completions, "--endpoint"),
    dataset: str = typer.Option(
        "random", "--dataset", help="random, or jsonl (with --dataset-path)."
    ),
    dataset_path: Path | None = typer.Option(
        None,
        "--dataset-path",
        help="A Spec-Bench-shaped JSONL file (question_id, category, turns).",
    ),
    category: list[str] = typer.Option(
        [],
        "--category",
        help="Keep only these categories (repeatable); also the profile category for --expect-profile.",
    ),
    input_len: int = typer.Option(64, "--input-len", help="random: words per prompt."),
    num_requests: int | None = typer.Option(
        None, "--num-requests", help="Requests to send (default 100 unless --duration)."
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Send for this many seconds instead."
    ),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Closed loop: at most C in flight (default 8)."
    ),
    request_rate: float | None = typer.Option(
        None, "--request-rate", help="Open loop: R requests/s, Poisson (gamma with --burstiness)."
    ),
    burstiness: float = typer.Option(
        1.0, "--burstiness", help="Gamma shape of arrivals (1 = Poisson)."
    ),
    warmup: int = typer.Option(
        0, "--warmup", help="Requests sent first and excluded from every figure."
    ),
    max_tokens: int = typer.Option(128, "--max-tokens"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos"),
    temperature: float = typer.Option(0.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    stream: bool = typer.Option(True, "--stream/--no-stream"),
    slo: str | None = typer.Option(
        None, "--slo", help="Goodput SLOs in ms, e.g. ttft:200,tpot:20."
    ),
    expect_acceptance_length: float | None = typer.Option(
        None, "--expect-acceptance-length", help="Judge the run against this AL."
    ),
    expect_profile: bool = typer.Option(
        False,
        "--expect-profile",
        help="Resolve the expected AL from the registry (--model, --method, --num-spec-tokens, --thinking, --category).",
    ),
    method: str | None = typer.Option(
        None, "--method", help="Speculative method for --expect-profile (default: the server's)."
    ),
    num_spec_tokens: int | None = typer.Option(
        None, "--num-spec-tokens", help="K for the verdict (default: what the requests report)."
    ),
    thinking: str | None = typer.Option(None, "--thinking"),
    registry: list[Path] = REGISTRY_OPTION,
    output_dir: Path | None = typer.Option(
        None, "--output-dir", help="Write summary.json, records.jsonl, summary.csv and plots here."
    ),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds per request."),
) -> None:
    """Benchmark an OpenAI-compatible server and its speculative decoding."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speclens.bench.client import LoadConfig
    from speclens.bench.datasets import jsonl_prompts, random_prompts
    from speclens.bench.figures import parse_slo
    from speclens.bench.report import print_summary, write_files
    from speclens.bench.run import Expectation, run_bench
    from speclens.bench.server import server_info

    if num_requests is not None and duration is not None:
        fail("give --num-requests or --duration, not both", code=2)
    if concurrency is not None and request_rate is not None:
        fail("give --concurrency or --request-rate, not both", code=2)
    if expect_profile and expect_acceptance_length is not None:
        fail("give --expect-acceptance-length or --expect-profile, not both", code=2)
    try:
        slos = parse_slo(slo)
    except ValueError as exc:
        fail(str(exc), code=2)
    count = num_requests if num_requests is not None else (None if duration else 100)
    with reported():
        if dataset == "jsonl":
            if dataset_path is None:
                fail("--dataset jsonl needs --dataset-path", code=2)
            prompts = jsonl_prompts(dataset_path, category or None)
        elif dataset == "random":
            prompts = random_prompts(max(count or 256, 1), input_len, max_tokens, seed)
        else:
            fail(f"--dataset must be random or jsonl, got {dataset!r}", code=2)
    expectation = None
    if expect_acceptance_length is not None:
        expectation = Expectation(
            expect_acceptance_length, num_spec_tokens, {"cli": "--expect-acceptance-length"}
        )
    elif expect_profile:
        info = asyncio.run(server_info(url, api_key)) or {}
        served = (info.get("acceptance") or {}) if isinstance(info, dict) else {}
        spec_method = method or served.get("method")
        k = num_spec_tokens or served.get("num_speculative_tokens")
        if not spec_method or not k:
            fail(
                "--expect-profile needs --method and --num-spec-tokens (the server does not report them)",
                code=2,
            )
        from speclens.acceptance import WorkloadAcceptance, resolve

        with reported():
            res = resolve(
                model=model, method=spec_method, num_spec_tokens=int(k), registry=load_registry(registry),
                workload=WorkloadAcceptance.model_validate({"thinking": thinking, "category": category[0] if category else None}),
            )  # fmt: skip
        expectation = Expectation(res.acceptance_length, res.num_spec_tokens, res.model_dump())
    config = LoadConfig(
        url=url, model=model, endpoint=endpoint.value, api_key=api_key,
        num_requests=count, duration=duration,
        concurrency=None if request_rate else (concurrency or 8), request_rate=request_rate,
        burstiness=burstiness, warmup=warmup, max_tokens=max_tokens, ignore_eos=ignore_eos,
        temperature=temperature, seed=seed, stream=stream, timeout=timeout,
    )  # fmt: skip
    settings: dict[str, Any] = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in {
            **config.__dict__,
            "dataset": dataset,
            "dataset_path": dataset_path,
            "categories": category,
            "slo": slo,
        }.items()
        if k != "api_key"
    }
    total = (count or 0) + warmup if count else None
    with Progress(
        TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True,
    ) as progress:  # fmt: skip
        task = progress.add_task("requests", total=total)
        outcome = asyncio.run(
            run_bench(
                config, prompts, expectation, slos, expect_spec=expectation is not None,
                on_done=lambda _r: progress.advance(task), settings=settings,
            )
        )  # fmt: skip
    print_summary(out_console, outcome.summary)
    if output_dir is not None:
        for path in write_files(output_dir, outcome.summary, outcome.records):
            out_console.print(f"wrote {path}")
    verdict = outcome.summary.get("verdict")
    if verdict is not None and not verdict["passed"]:
        raise typer.Exit(1)
