"""``speclens bench``: load an OpenAI-compatible server, measure speculative decoding request by
request, and judge the run against the acceptance it was supposed to hit.

Every option is checked before the first request (exit 2, one line naming the flag and its valid
range): a run that can only fail at the end is minutes lost. Exit codes: 0 the run met its
verdict (or had none) within ``--max-failure-rate``; 1 a failed verdict; 2 bad options; 3 more
failed requests than ``--max-failure-rate`` allows; 130 interrupted (Ctrl-C), files still written.

The command is three steps: ``BenchOptions`` (the flags as fields, as vLLM's ``EngineArgs``),
checked once and turned into the run's ``LoadConfig``, settings, prompts and expectation; the
run (``run``); and the report (``report``), shared with ``bench merge``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

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
    from speclens.acceptance import AcceptanceSpread
    from speclens.bench.client import Backend, LoadConfig, RequestRecord
    from speclens.bench.datasets import Prompt
    from speclens.bench.run import BenchOutcome, Expectation
    from speclens.bench.transport import Redactor
    from speclens.runs.report import RecordStream


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
    got = value if isinstance(value, int) else f"{value:g}"
    return f"command line: {flag}: expected {kind} {bound}, got {got}"


def checked_url(url: str, api_key: str | None) -> tuple[str | None, str, str | None]:
    """``--url`` as (why it is refused or None, the base URL the client uses, a note to print).

    A base URL is http(s)://[USER:PASSWORD@]HOST[:PORT][/PREFIX]: the client adds the ``/v1/...``
    routes itself, so a trailing ``/v1`` (the usual OpenAI base URL) is dropped with a note; a
    query, a fragment and port 0 are refused, and so are URL credentials with ``--api-key``
    (both would be an Authorization header). Messages show the URL with its password redacted.
    """
    from speclens.bench.transport import redact

    shown = redact(url)
    expected = f"command line: --url: expected http(s)://HOST[:PORT], got {shown!r}"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a bad port
    except ValueError as exc:
        return f"{expected} ({exc})", url, None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return expected, url, None
    for what, value in (("a query", parts.query), ("a fragment", parts.fragment)):
        if value or (what == "a query" and url.endswith("?")):
            return f"{expected} ({what} is not part of a base URL)", url, None
    if port == 0:
        return f"{expected} (port 0 is not a server's port)", url, None
    if parts.username is not None and api_key:
        return (
            f"command line: --url: {shown!r} carries credentials and --api-key is given; "
            "use one of them",
            url,
            None,
        )
    path = parts.path.rstrip("/")
    from speclens.bench.preflight import endpoint_suffix

    suffix = endpoint_suffix(path)
    if suffix is not None:
        base = urlunsplit(parts._replace(path=path.removesuffix(suffix).removesuffix("/v1")))
        return (
            f"command line: --url: {shown!r} ends in the endpoint path {suffix}; drop it and "
            f"give the base URL {redact(base)!r} (the client adds the routes)",
            url,
            None,
        )
    if not path.endswith("/v1"):
        return None, url, None
    base = urlunsplit(parts._replace(path=path.removesuffix("/v1")))
    note = (
        f"bench: --url: dropped the trailing /v1 of {shown!r}; requests go to {redact(base)}/v1/..."
    )
    return None, base, note


def url_problem(url: str) -> str | None:
    """One line when ``--url`` is not a base URL ``checked_url`` accepts (no ``--api-key``)."""
    return checked_url(url, None)[0]


def check(problems: list[str | None]) -> None:
    """Exit 2 with every problem found, one a line."""
    lines = [p for p in problems if p]
    if lines:
        fail(lines, code=2)


def open_records(output_dir: Path, redactor: Redactor | None = None) -> RecordStream:
    """The records stream in ``output_dir``: creating it is the writability check, before the
    first request (exit 2 when the directory cannot be created or written, or records.jsonl is
    a symbolic link)."""
    from speclens.runs.report import RecordStream

    try:
        return RecordStream(output_dir, redactor)
    except OSError as exc:
        where = exc.filename or output_dir
        fail(
            f"command line: --output-dir: cannot write to {str(where)!r}: {exc.strerror or exc}",
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


class SamplingChoice(StrEnum):
    category_round_robin = "category-round-robin"
    shuffle = "shuffle"
    in_order = "in-order"


class RoutingChoice(StrEnum):
    round_robin = "round-robin"
    least_outstanding = "least-outstanding"


#: The most worker processes ``--workers`` starts.
MAX_WORKERS = 256
#: Closed-loop concurrency and measured requests when neither is given.
DEFAULT_CONCURRENCY = 8
DEFAULT_NUM_REQUESTS = 100

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
    from speclens.bench.probe import probe_backend
    from speclens.bench.transport import redact

    found = [asyncio.run(probe_backend(u, api_key)) for u in urls]
    if len({p.backend for p in found}) > 1:
        seen = ", ".join(f"{redact(u)}: {p.backend}" for u, p in zip(urls, found, strict=True))
        fail(
            f"command line: --backend: auto found different engines ({seen}); pass --backend",
            code=2,
        )
    probe = found[0]
    if endpoint is EndpointChoice.native and probe.backend == "openai":
        fail(
            f"command line: --endpoint: native needs an SGLang or llama.cpp server; "
            f"{redact(urls[0])}: {probe.evidence}",
            code=2,
        )
    return probe.backend, probe.evidence


@dataclass(frozen=True)
class BenchOptions:
    """The command line as fields, one per flag (vLLM's ``EngineArgs`` shape): ``problems``
    checks them all before anything runs, and the methods below build what the run needs."""

    url: list[str]
    routing: RoutingChoice
    workers: int
    shard: str | None
    api_key: str | None
    model: str | None
    endpoint: EndpointChoice
    backend: BackendChoice
    dataset: str
    dataset_path: Path | None
    category: list[str]
    input_len: int
    num_requests: int | None
    duration: float | None
    concurrency: int | None
    request_rate: float | None
    burstiness: float
    warmup: int
    max_tokens: int
    ignore_eos: bool
    temperature: float
    seed: int
    stream: bool
    slo: str | None
    expect_acceptance_length: float | None
    expect_profile: bool
    method: str | None
    num_spec_tokens: int | None
    thinking: str | None
    registry: list[Path]
    output_dir: Path | None
    timeout: float
    max_failure_rate: float
    sampling: SamplingChoice = None  # type: ignore[assignment]
    preflight: bool = True
    expect_acceptance_spread: Path | None = None

    @property
    def sampling_name(self) -> str:
        """``--sampling`` (category-round-robin when not given, as in library use)."""
        return (self.sampling or SamplingChoice.category_round_robin).value

    @property
    def part(self) -> tuple[int, int]:
        return shard_problem(self.shard)[1]

    @property
    def count(self) -> int | None:
        """Measured requests: ``--num-requests``, else 100 unless ``--duration`` (or a trace:
        every request of it)."""
        if self.num_requests is not None:
            return self.num_requests
        return None if self.duration or self.dataset == "trace" else DEFAULT_NUM_REQUESTS

    def range_problems(self) -> list[str | None]:
        """Every flag outside its range, one line each."""
        from speclens.acceptance import MAX_NUM_SPEC_TOKENS

        number = "a number"
        k = self.num_spec_tokens
        return [
            shard_problem(self.shard)[0],
            range_problem("--workers", self.workers, 1, high=MAX_WORKERS),
            range_problem("--input-len", self.input_len, 1),
            range_problem("--num-requests", self.num_requests, 1),
            range_problem("--duration", self.duration, 0, above=True, kind=number),
            range_problem("--concurrency", self.concurrency, 1),
            range_problem("--request-rate", self.request_rate, 0, above=True, kind=number),
            range_problem("--burstiness", self.burstiness, 0, above=True, kind=number),
            range_problem("--warmup", self.warmup, 0),
            range_problem("--max-tokens", self.max_tokens, 1),
            range_problem("--temperature", self.temperature, 0, kind=number),
            range_problem("--seed", self.seed, 0),
            range_problem("--num-spec-tokens", k, 1, high=MAX_NUM_SPEC_TOKENS),
            range_problem("--timeout", self.timeout, 0, above=True, kind=number),
            range_problem("--max-failure-rate", self.max_failure_rate, 0, high=1, kind=number),
            range_problem(
                "--expect-acceptance-length", self.expect_acceptance_length, 1,
                high=None if k is None or k > MAX_NUM_SPEC_TOKENS else k + 1, kind=number,
            ),
        ]  # fmt: skip

    def conflicts(self) -> str | None:
        """The first pair of flags that cannot go together, or a missing one."""
        parts = self.part[1] * self.workers
        if self.model is None:
            return "command line: --model: required (the served model name)"
        if len(set(self.url)) < len(self.url):
            return "command line: --url: a replica is given twice"
        if self.request_rate is None and (self.concurrency or DEFAULT_CONCURRENCY) < parts:
            return (
                f"command line: --concurrency: expected at least one request per worker and "
                f"shard ({parts}), got {self.concurrency}"
            )
        pairs = [
            (self.num_requests is not None and self.duration is not None,
             "give --num-requests or --duration, not both"),
            (self.concurrency is not None and self.request_rate is not None,
             "give --concurrency or --request-rate, not both"),
            (self.dataset == "trace" and (self.concurrency is not None or self.request_rate is not None
                                          or self.duration is not None),
             "command line: --dataset trace sends every request at its own arrival: give no "
             "--concurrency, --request-rate or --duration"),
            (self.expect_profile and self.expect_acceptance_length is not None,
             "give --expect-acceptance-length or --expect-profile, not both"),
            (self.expect_acceptance_spread is not None and self.expect_profile,
             "command line: --expect-acceptance-spread: goes with --expect-acceptance-length; "
             "--expect-profile carries the profile's own spread"),
            (self.expect_acceptance_spread is not None and self.expect_acceptance_length is None,
             "command line: --expect-acceptance-spread: needs --expect-acceptance-length (the "
             "AL it spreads)"),
            (self.endpoint is EndpointChoice.native and self.backend is BackendChoice.openai,
             "command line: --endpoint: native needs --backend sglang, llamacpp or auto, "
             "got --backend openai"),
        ]  # fmt: skip
        return next((why for bad, why in pairs if bad), None)

    def checked(self) -> BenchOptions:
        """These options with each ``--url`` as the client uses it; exit 2 on any problem."""
        urls = [checked_url(u, self.api_key) for u in self.url]
        check([*(why for why, _, _ in urls), *self.range_problems()])
        check([self.conflicts()])
        self.stated_spread()
        for _, _, note in urls:
            if note:
                err_console.print(note, markup=False, highlight=False)
        return replace(self, url=[base for _, base, _ in urls])

    def prompts(self) -> list[Prompt]:
        from speclens.bench.datasets import (
            jsonl_prompts,
            random_prompts,
            sample_prompts,
            trace_prompts,
        )
        from speclens.runs.trace import TraceError

        with reported():
            if self.dataset == "jsonl":
                if self.dataset_path is None:
                    fail("--dataset jsonl needs --dataset-path", code=2)
                rows = jsonl_prompts(self.dataset_path, self.category or None)
                return sample_prompts(rows, self.sampling_name, self.seed)
            if self.dataset == "trace":
                if self.dataset_path is None:
                    fail(
                        "--dataset trace needs --dataset-path (a JSONL trace or a run directory)",
                        code=2,
                    )
                try:
                    return trace_prompts(self.dataset_path)
                except TraceError as exc:
                    fail(exc.lines)
            if self.dataset == "random":
                size = max(self.count or 256, 1)
                return random_prompts(size, self.input_len, self.max_tokens, self.seed)
        fail(f"--dataset must be random, jsonl or trace, got {self.dataset!r}", code=2)

    def expectation(self) -> Expectation | None:
        """What the run is judged against: ``--expect-acceptance-length``, or the registry's
        profile for the model, method and K (``--expect-profile``), or nothing."""
        from speclens.bench.run import Expectation

        if self.expect_acceptance_length is not None:
            spread = self.served_spread()
            source: dict[str, Any] = {"cli": "--expect-acceptance-length"}
            if spread is not None:
                source["spread"] = {"file": str(self.expect_acceptance_spread),
                                    **spread.model_dump(exclude_none=True)}  # fmt: skip
            return Expectation(
                self.expect_acceptance_length, self.num_spec_tokens, source, spread=spread
            )
        if not self.expect_profile:
            return None
        return self._profile_expectation()

    def stated_spread(self) -> AcceptanceSpread | None:
        """``--expect-acceptance-spread`` read and checked against the stated AL and
        ``--num-spec-tokens``: exit 2, one line a problem naming the file and the field."""
        path = self.expect_acceptance_spread
        if path is None or self.expect_acceptance_length is None:
            return None
        from speclens.acceptance import AcceptanceSpread, ValidationError, load
        from speclens.acceptance.spread import DEFAULT_TOLERANCE, implied_mean

        try:
            spread = load(AcceptanceSpread, path)
        except ValidationError as exc:
            fail([str(p) for p in exc.problems], code=2)
        if self.num_spec_tokens is not None:
            self._same_k(spread, self.num_spec_tokens, "--num-spec-tokens")
        length = self.expect_acceptance_length
        mean = implied_mean(spread.values)
        limit = DEFAULT_TOLERANCE if spread.tolerance is None else spread.tolerance
        if abs(mean - length) > limit + 1e-12:
            fail(
                f"{path}: quantiles: imply a mean AL of {mean:.4f}, {abs(mean - length):.4f} "
                f"from --expect-acceptance-length {length:g}, beyond the tolerance {limit:g}",
                code=2,
            )
        return spread

    def served_spread(self) -> AcceptanceSpread | None:
        """``stated_spread``, and its K against the K the server reports on ``/version`` when
        ``--num-spec-tokens`` does not state one (a GET, before any request is sent)."""
        spread = self.stated_spread()
        if spread is None or self.num_spec_tokens is not None:
            return spread
        from speclens.bench.server import served_speculation, server_info

        info = asyncio.run(server_info(self.url[0], self.api_key))
        served = served_speculation(info)["num_speculative_tokens"]
        if served is not None:
            self._same_k(spread, served, "the server's /version")
        return spread

    def _same_k(self, spread: AcceptanceSpread, k: int, where: str) -> None:
        if spread.num_spec_tokens != k:
            fail(
                f"{self.expect_acceptance_spread}: num_spec_tokens: is "
                f"{spread.num_spec_tokens}, but {where} says K {k}: a spread is refused at "
                "another K, never rescaled",
                code=2,
            )

    def _profile_expectation(self) -> Expectation:
        from speclens.acceptance import WorkloadAcceptance, resolve
        from speclens.bench.run import Expectation
        from speclens.bench.server import served_speculation, server_info

        served = served_speculation(asyncio.run(server_info(self.url[0], self.api_key)))
        spec_method = self.method or served.get("method")
        k = self.num_spec_tokens or served.get("num_speculative_tokens")
        if not spec_method or not k:
            fail(
                "--expect-profile needs --method and --num-spec-tokens (the server does not "
                "report them)",
                code=2,
            )
        workload = {"thinking": self.thinking, "category": self.category[0] if self.category else None}  # fmt: skip
        with reported():
            res = resolve(
                model=str(self.model), method=spec_method, num_spec_tokens=int(k),
                registry=load_registry(self.registry),
                workload=WorkloadAcceptance.model_validate(workload),
            )  # fmt: skip
        return Expectation(
            res.acceptance_length, res.num_spec_tokens, res.model_dump(), spread=res.spread
        )

    def load_config(self, backend: Backend) -> LoadConfig:
        """The flags that are the load generator's fields, under their field names."""
        from speclens.bench.client import LoadConfig

        return LoadConfig(
            url=self.url[0], urls=tuple(self.url), routing=self.routing.value, part=self.part,
            model=str(self.model), endpoint=self.endpoint.value, backend=backend,
            api_key=self.api_key, num_requests=self.count, duration=self.duration,
            concurrency=None if self.request_rate or self.dataset == "trace"
            else (self.concurrency or DEFAULT_CONCURRENCY),
            trace=self.dataset == "trace",
            request_rate=self.request_rate, burstiness=self.burstiness, warmup=self.warmup,
            max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
            temperature=self.temperature, seed=self.seed, stream=self.stream,
            timeout=self.timeout,
        )  # fmt: skip

    def settings(
        self, config: LoadConfig, evidence: str | None, prompts: list[Prompt] | None = None
    ) -> dict[str, Any]:
        """The run's settings as summary.json records them: no API key, no URL password; the
        dataset's digest (``prompts_sha256``), so ``compare`` can tell runs of other prompts."""
        fields = {"dataset": self.dataset, "dataset_path": self.dataset_path,
                  "categories": self.category, "slo": self.slo,
                  "prompt_sampling": self.sampling_name if self.dataset == "jsonl" else None}  # fmt: skip
        settings = load_settings(config)
        settings.update({k: (str(v) if isinstance(v, Path) else v) for k, v in fields.items()})
        settings["backend_requested"] = self.backend.value
        settings["backend_evidence"] = evidence
        settings["max_failure_rate"] = self.max_failure_rate
        # The K the user states, for a server that reports none (llama.cpp): the run's K then.
        settings["num_speculative_tokens"] = self.num_spec_tokens
        settings["workers"] = self.workers
        settings["shard"] = list(self.part) if self.shard is not None else None
        rows = prompts if prompts is not None else self.prompts()
        settings["prompts_sha256"] = prompts_digest(rows)
        from speclens.bench.host import host_load

        settings["host"] = host_load()  # compare shows it: a loaded machine moves a run
        from speclens.runs.rundir import SETTINGS_SCHEMA

        settings["settings_schema"] = SETTINGS_SCHEMA  # records every field compare checks
        return settings

    def expected_records(self) -> int | None:
        """This shard's records (warm-up and measured), for the progress bar; None: a duration."""
        p, n = self.part
        count = self.count
        return len(range(p, self.warmup, n)) + len(range(p, count, n)) if count else None


def load_settings(config: LoadConfig) -> dict[str, Any]:
    """A load's settings as summary.json records them (``bench``, ``demo``): every field but the
    API key, each URL without its password."""
    from speclens.bench.transport import redact

    settings = {k: v for k, v in config.__dict__.items() if k != "api_key"}
    settings["url"] = redact(config.url)
    settings["urls"] = tuple(redact(u) for u in config.urls)
    return settings


def prompts_digest(prompts: list[Prompt]) -> str:
    """The prompts' digest (``prompts_sha256``), so ``compare`` can tell runs of other prompts."""
    from speclens.runs.compare_inputs import prompts_sha256

    return prompts_sha256((p.category, p.max_tokens, p.text) for p in prompts)


@app.callback()
def bench(
    ctx: typer.Context,
    url: list[str] = typer.Option(
        ["http://127.0.0.1:8000"],
        "--url",
        help="The server's base URL; repeat it for several replicas (see --routing). A trailing "
        "/v1 is dropped; USER:PASSWORD@ is sent as basic auth (and never written).",
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
        "random",
        "--dataset",
        help="random, jsonl (with --dataset-path), or trace (--dataset-path: a Mooncake-style "
        "JSONL trace or a run directory, each request sent at its own arrival).",
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
    expect_acceptance_spread: Path | None = typer.Option(
        None,
        "--expect-acceptance-spread",
        help="With --expect-acceptance-length: a spread file (per-request AL quantiles p0..p100 "
        "at K) the run was forced with; the verdict also tests the per-request ALs against it.",
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
        None,
        "--num-spec-tokens",
        help="K, in [1, 64]: for the verdict, and the run's K where the server reports none "
        "(default: what the requests report).",
    ),
    thinking: str | None = typer.Option(None, "--thinking"),
    registry: list[Path] = REGISTRY_OPTION,
    output_dir: Path | None = typer.Option(
        None, "--output-dir", help="Write summary.json, records.jsonl, summary.csv and plots here."
    ),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds per request."),
    max_failure_rate: float = MAX_FAILURE_RATE_OPTION,
    sampling: SamplingChoice = typer.Option(
        SamplingChoice.category_round_robin,
        "--sampling",
        help="jsonl: the order prompts are taken in: category-round-robin (seeded by --seed, "
        "so a few requests cover every category), shuffle (seeded), or in-order (file order).",
    ),
    preflight: bool = typer.Option(
        True,
        "--preflight/--no-preflight",
        help="Before the run, ask /v1/models and send one 1-token request (not counted): an "
        "unreachable server or an unserved --model fails at once (exit 1).",
    ),
) -> None:
    """Benchmark an OpenAI-compatible server and its speculative decoding."""
    flags = {k: v for k, v in locals().items() if k != "ctx"}
    if ctx.invoked_subcommand is not None:
        return
    options = BenchOptions(**flags).checked()
    from speclens.runs.figures import parse_slo

    try:
        slos = parse_slo(options.slo)
    except ValueError as exc:
        fail(str(exc), code=2)
    prompts = options.prompts()
    # A stated expectation (and its spread's K against the server's) is refused before any
    # request; a profile's waits for the preflight, which says why a server cannot answer.
    expectation = None if options.expect_profile else options.expectation()
    if options.preflight:
        check_servers(options)
    if options.expect_profile:
        expectation = options.expectation()
    chosen, evidence = resolve_backend(options.backend, options.endpoint, options.url, api_key)
    config = options.load_config(chosen)
    outcome, records_out = run(
        options, config, prompts, expectation, slos, options.settings(config, evidence, prompts)
    )
    report(outcome, records_out)


def check_servers(options: BenchOptions) -> None:
    """The preflight of every ``--url`` (``speclens.bench.preflight``): exit 1 with one line when
    one cannot be measured, before anything is measured or written."""
    from speclens.bench.preflight import PreflightError, preflight_all

    try:
        notes = asyncio.run(
            preflight_all(
                options.url, str(options.model), options.endpoint.value, options.api_key,
                min(options.timeout, PREFLIGHT_REQUEST_TIMEOUT_S),
            )
        )  # fmt: skip
    except PreflightError as exc:
        fail(str(exc))
    for note in notes:
        err_console.print(note, markup=False, highlight=False)


#: The most seconds the preflight's 1-token request may take (or ``--timeout``, when less).
PREFLIGHT_REQUEST_TIMEOUT_S = 120.0
#: Seconds between progress lines when stderr is not a terminal.
PROGRESS_EVERY_S = 10.0


def run(
    options: BenchOptions,
    config: LoadConfig,
    prompts: list[Prompt],
    expectation: Expectation | None,
    slos: dict[str, float],
    settings: dict[str, Any],
) -> tuple[BenchOutcome, RecordStream | None]:
    """The run, with a progress bar and records.jsonl streamed as requests finish; exit 130 on
    a second Ctrl-C (the finished requests are on disk), 1 when a worker process failed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speclens.bench.run import run_bench
    from speclens.bench.transport import Redactor
    from speclens.bench.workers import WorkerFailed
    from speclens.runs.verify import thin_categories

    redactor = Redactor.for_urls(config.replicas)
    records_out = None
    if options.output_dir is not None:
        records_out = open_records(options.output_dir, redactor)
    try:
        with Progress(
            TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=err_console, transient=True,
        ) as progress:  # fmt: skip
            total = options.expected_records()
            task = progress.add_task("requests", total=total)
            finished = [0]

            def done(record: RequestRecord) -> None:
                progress.advance(task)
                finished[0] += 1
                if records_out is not None:
                    records_out.write(record)

            with progress_lines(lambda: finished[0], total, not err_console.is_terminal):
                outcome = asyncio.run(
                    run_bench(
                        config, prompts, expectation, slos, expect_spec=expectation is not None,
                        on_done=done, settings=settings, max_failure_rate=options.max_failure_rate,
                        workers=options.workers,
                    )
                )  # fmt: skip
    except WorkerFailed as exc:
        fail(redactor.text(str(exc).splitlines()[0]))
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside the load phase
        where = f"; finished requests are in {records_out.path}" if records_out else ""
        fail(f"bench: interrupted{where}", code=130)
    finally:
        if records_out is not None:
            records_out.close()
    outcome.summary = redactor.data(outcome.summary)
    outcome.summary.setdefault("warnings", []).extend(thin_categories(outcome.summary))
    return outcome, records_out


@contextlib.contextmanager
def progress_lines(
    finished: Callable[[], int], total: int | None, enabled: bool, every: float = PROGRESS_EVERY_S
) -> Iterator[None]:
    """While the run goes, a line on stderr every ``every`` seconds (``bench: 40/100 requests
    finished, 20 s``) when stderr is not a terminal (a log, CI), where the bar shows nothing."""
    if not enabled:
        yield
        return
    stop = threading.Event()
    start = time.monotonic()

    def tick() -> None:
        while not stop.wait(every):
            of = f"/{total}" if total else ""
            err_console.print(
                f"bench: {finished()}{of} requests finished, {time.monotonic() - start:.0f} s",
                markup=False, highlight=False,
            )  # fmt: skip

    thread = threading.Thread(target=tick, name="speclens-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every)


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
    from speclens.runs.report import print_summary, write_files

    print_summary(out_console, outcome.summary)
    spread = (outcome.summary.get("verdict") or {}).get("spread")
    if spread:
        from speclens.runs.verify import spread_line

        out_console.print(spread_line(spread), markup=False, highlight=False, soft_wrap=True)
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
