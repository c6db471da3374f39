"""``speclens bench``: load an OpenAI-compatible server, measure speculative decoding request by
request, and judge the run against the acceptance it was supposed to hit.

Every option is checked before the first request (exit 2, one line naming the flag and its valid
range): a run that can only fail at the end is minutes lost. Exit codes: 0 the run met its
verdict (or had none) within ``--max-failure-rate``; 1 a failed verdict; 2 bad options; 3 more
failed requests than ``--max-failure-rate`` allows; 130 interrupted (Ctrl-C), files still written.
"""

from __future__ import annotations

import asyncio
import math
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import typer

from speclens.cli._common import (
    REGISTRY_OPTION,
    err_console,
    fail,
    load_registry,
    out_console,
    reported,
)

if TYPE_CHECKING:
    from speclens.bench.client import Backend
    from speclens.bench.report import RecordStream
    from speclens.bench.run import BenchOutcome


def range_problem(
    flag: str,
    value: float | None,
    low: float,
    *,
    above: bool = False,
    high: float | None = None,
    kind: str = "an integer",
) -> str | None:
    """One line when ``value`` (None: not given) is not finite or outside its range."""
    if value is None:
        return None
    ok = math.isfinite(value) and (value > low if above else value >= low)
    if ok and (high is None or value <= high):
        return None
    bound = f"in [{low:g}, {high:g}]" if high is not None else f"{'>' if above else '>='} {low:g}"
    return f"command line: {flag}: expected {kind} {bound}, got {value:g}"


def url_problem(url: str) -> str | None:
    """One line when ``--url`` is not an http(s) URL with a host (and a valid port)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        return f"command line: --url: expected http(s)://HOST[:PORT], got {url!r} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"command line: --url: expected http(s)://HOST[:PORT], got {url!r}"
    return None


def check(problems: list[str | None]) -> None:
    """Exit 2 with every problem found, one a line."""
    lines = [p for p in problems if p]
    if lines:
        fail(lines, code=2)


def open_records(output_dir: Path) -> RecordStream:
    """The records stream in ``output_dir``: creating it is the writability check, before the
    first request (exit 2 when the directory cannot be created or written)."""
    from speclens.bench.report import RecordStream

    try:
        return RecordStream(output_dir)
    except OSError as exc:
        fail(
            f"command line: --output-dir: cannot write to {str(output_dir)!r}: "
            f"{exc.strerror or exc}",
            code=2,
        )


MAX_FAILURE_RATE_OPTION = typer.Option(
    0.0,
    "--max-failure-rate",
    help="Share of measured requests allowed to fail, in [0, 1]; above it the run exits 3 and "
    "no verdict passes.",
)


class EndpointChoice(StrEnum):
    completions = "completions"
    chat = "chat"
    native = "native"


class BackendChoice(StrEnum):
    auto = "auto"
    openai = "openai"
    sglang = "sglang"
    llamacpp = "llamacpp"


class RoutingChoice(StrEnum):
    round_robin = "round-robin"
    least_outstanding = "least-outstanding"


#: The most worker processes ``--workers`` starts.
MAX_WORKERS = 256

app = typer.Typer(
    help="Benchmark an OpenAI-compatible server and its speculative decoding.",
    invoke_without_command=True,
    add_completion=False,
)


def shard_problem(text: str | None) -> tuple[str | None, tuple[int, int]]:
    """``--shard i/n`` as (i, n), or one line saying why it is not 0 <= i < n."""
    if text is None:
        return None, (0, 1)
    i, sep, n = text.partition("/")
    if sep and i.strip().isdigit() and n.strip().isdigit() and int(i) < int(n):
        return None, (int(i), int(n))
    return f"command line: --shard: expected I/N with 0 <= I < N, got {text!r}", (0, 1)


def resolve_backend(
    backend: BackendChoice, endpoint: EndpointChoice, urls: list[str], api_key: str | None
) -> tuple[Backend, str | None]:
    """The backend the run uses and, for ``auto``, what the probes found (before the run, out
    of its measured time). Exit 2 when replicas differ or native has no engine to go to."""
    if backend is not BackendChoice.auto:
        return backend.value, None  # type: ignore[return-value]
    from speclens.bench.client import probe_backend

    found = [asyncio.run(probe_backend(u, api_key)) for u in urls]
    if len({p.backend for p in found}) > 1:
        seen = ", ".join(f"{u}: {p.backend}" for u, p in zip(urls, found, strict=True))
        fail(
            f"command line: --backend: auto found different engines ({seen}); pass --backend",
            code=2,
        )
    probe = found[0]
    if endpoint is EndpointChoice.native and probe.backend == "openai":
        fail(
            f"command line: --endpoint: native needs an SGLang or llama.cpp server; {urls[0]}: "
            f"{probe.evidence}",
            code=2,
        )
    return probe.backend, probe.evidence


@app.callback()
def bench(
    ctx: typer.Context,
    url: list[str] = typer.Option(
        ["http://127.0.0.1:8000"],
        "--url",
        help="The server's base URL; repeat it for several replicas (see --routing).",
    ),
    routing: RoutingChoice = typer.Option(
        RoutingChoice.round_robin,
        "--routing",
        help="Over several --url: round-robin (by request index) or least-outstanding (fewest "
        "in flight from this process).",
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        help="Load-generating processes, each with its share of the concurrency or arrivals.",
    ),
    shard: str | None = typer.Option(
        None,
        "--shard",
        help="I/N: send this shard's share of the run (arrivals I, I+N, ...); join the shards' "
        "output directories with `speclens bench merge`.",
    ),
    api_key: str | None = typer.Option(None, "--api-key"),
    model: str | None = typer.Option(None, "--model", help="The served model name (required)."),
    endpoint: EndpointChoice = typer.Option(
        EndpointChoice.completions,
        "--endpoint",
        help="completions, chat, or native: the backend's own route (SGLang POST /generate, "
        "llama.cpp POST /completion).",
    ),
    backend: BackendChoice = typer.Option(
        BackendChoice.auto,
        "--backend",
        help="The engine: auto (probe SGLang's /get_model_info and /get_server_info and "
        "llama.cpp's /props before the run), openai, sglang (asks for its per-request stats) or "
        "llamacpp.",
    ),
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
    max_failure_rate: float = MAX_FAILURE_RATE_OPTION,
) -> None:
    """Benchmark an OpenAI-compatible server and its speculative decoding."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speclens.bench.client import LoadConfig, RequestRecord
    from speclens.bench.datasets import jsonl_prompts, random_prompts
    from speclens.bench.figures import parse_slo
    from speclens.bench.run import Expectation, run_bench
    from speclens.bench.server import served_speculation, server_info
    from speclens.bench.workers import WorkerFailed

    number = "a number"
    why_shard, part = shard_problem(shard)
    check([
        *(url_problem(u) for u in url),
        why_shard,
        range_problem("--workers", workers, 1, high=MAX_WORKERS),
        range_problem("--input-len", input_len, 1),
        range_problem("--num-requests", num_requests, 1),
        range_problem("--duration", duration, 0, above=True, kind=number),
        range_problem("--concurrency", concurrency, 1),
        range_problem("--request-rate", request_rate, 0, above=True, kind=number),
        range_problem("--burstiness", burstiness, 0, above=True, kind=number),
        range_problem("--warmup", warmup, 0),
        range_problem("--max-tokens", max_tokens, 1),
        range_problem("--temperature", temperature, 0, kind=number),
        range_problem("--seed", seed, 0),
        range_problem("--num-spec-tokens", num_spec_tokens, 1),
        range_problem("--timeout", timeout, 0, above=True, kind=number),
        range_problem("--max-failure-rate", max_failure_rate, 0, high=1, kind=number),
        range_problem(
            "--expect-acceptance-length", expect_acceptance_length, 1,
            high=None if num_spec_tokens is None else num_spec_tokens + 1, kind=number,
        ),
    ])  # fmt: skip
    if model is None:
        fail("command line: --model: required (the served model name)", code=2)
    if len(set(url)) < len(url):
        fail("command line: --url: a replica is given twice", code=2)
    parts = part[1] * workers
    if request_rate is None and (concurrency or 8) < parts:
        fail(
            f"command line: --concurrency: expected at least one request per worker and shard "
            f"({parts}), got {concurrency}",
            code=2,
        )
    if num_requests is not None and duration is not None:
        fail("give --num-requests or --duration, not both", code=2)
    if concurrency is not None and request_rate is not None:
        fail("give --concurrency or --request-rate, not both", code=2)
    if expect_profile and expect_acceptance_length is not None:
        fail("give --expect-acceptance-length or --expect-profile, not both", code=2)
    if endpoint is EndpointChoice.native and backend is BackendChoice.openai:
        fail(
            "command line: --endpoint: native needs --backend sglang, llamacpp or auto, "
            "got --backend openai",
            code=2,
        )
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
        served = served_speculation(asyncio.run(server_info(url[0], api_key)))
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
    chosen, evidence = resolve_backend(backend, endpoint, url, api_key)
    config = LoadConfig(
        url=url[0], urls=tuple(url), routing=routing.value, part=part,
        model=model, endpoint=endpoint.value, backend=chosen, api_key=api_key,
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
    settings["backend_requested"] = backend.value
    settings["backend_evidence"] = evidence
    settings["max_failure_rate"] = max_failure_rate
    settings["workers"] = workers
    settings["shard"] = list(part) if shard is not None else None
    share = len(range(part[0], warmup, part[1])) + len(range(part[0], count or 0, part[1]))
    total = share if count else None
    records_out = open_records(output_dir) if output_dir is not None else None
    try:
        with Progress(
            TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err_console, transient=True,
        ) as progress:  # fmt: skip
            task = progress.add_task("requests", total=total)

            def done(record: RequestRecord) -> None:
                progress.advance(task)
                if records_out is not None:
                    records_out.write(record)

            outcome = asyncio.run(
                run_bench(
                    config, prompts, expectation, slos, expect_spec=expectation is not None,
                    on_done=done, settings=settings, max_failure_rate=max_failure_rate,
                    workers=workers,
                )
            )  # fmt: skip
    except WorkerFailed as exc:
        fail(str(exc).splitlines()[0])
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside the load phase
        fail("bench: interrupted" + (f"; finished requests are in {records_out.path}" if records_out else ""), code=130)  # fmt: skip
    finally:
        if records_out is not None:
            records_out.close()
    report(outcome, records_out)


@app.command("merge")
def merge(
    directories: list[Path] = typer.Argument(
        ..., help="Output directories of the shards of one run (--shard I/N), one each."
    ),
    output_dir: Path = typer.Option(
        ..., "--output-dir", help="Write the merged summary.json, records.jsonl, CSV and plots."
    ),
) -> None:
    """Merge runs sharded across machines into one report, every figure recomputed from the
    merged records. Exit 1 when the runs are not the shards of one run; 3 when more requests
    failed than the run's --max-failure-rate allows; 130 when a shard was interrupted; 2 when
    --output-dir is one of the shards."""
    from speclens.bench.merge import merge as merge_runs
    from speclens.bench.merge import output_problem

    problem = output_problem(output_dir, directories)
    if problem is not None:
        fail(problem, code=2)
    with reported():
        outcome = merge_runs(directories)
    records_out = open_records(output_dir)
    with records_out:
        for record in outcome.records:
            records_out.write(record)
    report(outcome, records_out)


def report(outcome: BenchOutcome, records_out: RecordStream | None) -> None:
    """Print the summary, write the files beside ``records.jsonl`` (when there is one) and exit
    with the run's code: the end of ``bench`` and of ``bench merge``."""
    from speclens.bench.report import print_summary, write_files

    print_summary(out_console, outcome.summary)
    if records_out is not None:
        out_console.print(f"wrote {records_out.path} ({records_out.count} records)")
        out_dir = records_out.path.parent
        try:
            paths = write_files(out_dir, outcome.summary, outcome.records)
        except OSError as exc:
            fail(f"{exc.filename or out_dir}: cannot write: {exc.strerror or exc}")
        for path in paths:
            out_console.print(f"wrote {path}")
        if records_out.error:
            fail(f"{records_out.error}: records.jsonl is incomplete")
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)
