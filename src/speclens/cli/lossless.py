"""``speclens lossless``: does a server's speculative decoding change what it generates?

It compares the server with a reference serving the same weights without speculation: greedy
outputs must be identical; sampled outputs must pass a chi-square test of homogeneity per
position at a family-wise false-alarm rate ``--alpha``, and with the power to see a total
variation of ``--min-effect``. Exit codes (docs/exit-codes.md): 0 pass; 1 flagged (outputs
differ) or an invalid prompt file; 2 bad options; 3 requests failed (no verdict); 4 inconclusive
(no test ran, or too few samples to see ``--min-effect``); 130 interrupted.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import typer

from speclens.cli._common import fail, out_console, reported
from speclens.cli.bench import EndpointChoice, check, range_problem, url_problem

if TYPE_CHECKING:
    from speclens.bench.lossless import LosslessReport

FLAGGED, REQUESTS_FAILED, INCONCLUSIVE = 1, 3, 4
GREEDY_MAX_TOKENS = 32
SAMPLED_MAX_TOKENS = 5  # token positions 2..5: the first drafts of every verify step
DEFAULT_SAMPLES = 200
MAX_POSITIONS = 1024  # token positions one run may test
MAX_SIZED_SAMPLES = 100_000  # a side and prompt: what --min-effect may ask for
SIZING_DF = 4  # tests assumed to have up to 5 categories when --top-k does not bound them


def parse_positions(text: str) -> tuple[list[int] | None, str | None]:
    """``2,3,7`` or ``2-5`` (or both, ``2-4,9``): sorted 1-based token positions, or a problem."""
    problem = (
        "command line: --positions: expected token positions like 2,3 or 2-5 (each >= 1, "
        f"at most {MAX_POSITIONS}), got {text!r}"
    )
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdecimal() or not (high or low).isdecimal():
            return None, problem
        first, last = int(low), int(high or low)
        if first < 1 or last < first or last - first >= MAX_POSITIONS:
            return None, problem
        found.update(range(first, last + 1))
        if len(found) > MAX_POSITIONS:
            return None, problem
    return sorted(found), None


def sized_samples(min_effect: float, alpha: float, tests: int, top_k: int | None) -> int:
    """Samples a side for every planned test to see ``min_effect`` with 80% power at the
    Bonferroni level (tests of ``top_k`` df when given, else ``SIZING_DF``)."""
    from speclens.bench.lossless import samples_for_effect

    return samples_for_effect(min_effect, alpha / tests, top_k or SIZING_DF)


def _prompts(given: list[str], dataset_path: Path | None, count: int, seed: int) -> list[str]:
    """``--prompt`` texts, or ``count`` prompts from the JSONL taken round robin over its
    categories (so a few prompts still cover many), or ``count`` seeded synthetic ones."""
    from speclens.bench.datasets import jsonl_prompts, random_prompts

    if given:
        return given
    if dataset_path is None:
        return [p.text for p in random_prompts(count, 32, 1, seed)]
    by_category: dict[str, list[str]] = {}
    for p in jsonl_prompts(dataset_path):
        by_category.setdefault(p.category, []).append(p.text)
    rounds = itertools.zip_longest(*by_category.values())
    return [t for t in itertools.chain.from_iterable(rounds) if t is not None][:count]


def _reference_url_problem(url: str) -> str | None:
    problem = url_problem(url)
    return problem.replace("--url", "--reference-url", 1) if problem else None


def _print(report: LosslessReport, url: str, reference_url: str) -> None:
    word = {"pass": "PASS", "flagged": "FLAGGED", "inconclusive": "INCONCLUSIVE"}[report.verdict]
    verdict = f"{word}: {report.reason}"
    if report.failed_requests:
        verdict = f"NO VERDICT: {report.failed_requests} requests failed"
    say = out_console.print
    say(f"speclens lossless: {verdict}", markup=False)
    say(f"server {url} against reference {reference_url}; compared by {report.mode}", markup=False)
    say(f"compared: {report.compared}", markup=False)
    for error in report.errors:
        say(f"failed request: {error}", markup=False)
    if report.temperature == 0:
        _print_greedy(report)
    else:
        _print_sampled(report)


def _print_greedy(report: LosslessReport) -> None:
    say = out_console.print
    checked = len(report.divergences) + report.identical
    say(
        f"identical: {report.identical} of {checked} prompts "
        f"({100 * report.identical_share:.1f}%; tolerance {100 * report.tolerance:g}% differ)",
        markup=False,
    )
    for d in report.divergences[:5]:
        say(
            f"prompt {d.prompt}: first divergent {d.mode[:-1]} at index {d.index}: server "
            f"{d.server!r}, reference {d.reference!r}; character {d.char_index}: server "
            f"{d.server_context!r}, reference {d.reference_context!r}",
            markup=False,
        )


def _print_sampled(report: LosslessReport) -> None:
    say = out_console.print
    say(f"samples: {report.samples} per prompt and server, {report.prompts} prompts", markup=False)
    worst = report.worst
    if worst is None:
        say("tests: 0", markup=False)
        return
    say(
        f"tests: {report.tests}; most significant: prompt {worst.prompt}, position "
        f"{worst.position}: chi-square {worst.statistic:.2f} (df {worst.df}), p {worst.p_value:.3g}; "
        f"Bonferroni p {report.p_value:.3g} {'<' if report.verdict == 'flagged' else '>='} "
        f"alpha {report.alpha:g}",
        markup=False,
    )
    say(
        f"detectable: total variation {report.detectable_tv:.3g} at 80% power "
        f"(--min-effect {report.min_effect:g}; {report.samples_needed} samples a side reach it)",
        markup=False,
    )
    say(
        "counts there (category: server, reference): "
        + ", ".join(f"{k}: {a}, {b}" for k, (a, b) in worst.counts.items()),
        markup=False,
    )


def lossless(
    url: str = typer.Option(..., "--url", help="The server under test (speculation on)."),
    reference_url: str = typer.Option(
        ..., "--reference-url", help="A server with the same weights and no speculation."
    ),
    model: str = typer.Option(..., "--model", help="The model name the server serves."),
    reference_model: str | None = typer.Option(
        None, "--reference-model", help="The reference's model name (default: --model)."
    ),
    api_key: str | None = typer.Option(None, "--api-key"),
    reference_api_key: str | None = typer.Option(None, "--reference-api-key"),
    endpoint: EndpointChoice = typer.Option(EndpointChoice.completions, "--endpoint"),
    temperature: float = typer.Option(
        0.0, "--temperature", help="0: greedy, outputs must be identical; > 0: a sampled test."
    ),
    top_k: int | None = typer.Option(
        None, "--top-k", help="Sent with every request when given (sharpens a flat distribution)."
    ),
    samples: int | None = typer.Option(
        None,
        "--samples",
        help=f"Sampled: samples per prompt from each server (default {DEFAULT_SAMPLES}, or what "
        "--min-effect needs).",
    ),
    min_effect: float | None = typer.Option(
        None,
        "--min-effect",
        help="Sampled: the total variation distance the test must detect with 80% power, in "
        "(0, 1] (default 0.4); sizes --samples when that is not given. Weaker: inconclusive.",
    ),
    positions: str | None = typer.Option(
        None,
        "--positions",
        help="Sampled: the token positions tested, 1-based, e.g. 2,3 or 2-5 (default 2..M; "
        "by characters, position p stands for characters 4(p-1)..4p-1).",
    ),
    max_tokens: int | None = typer.Option(
        None,
        "--max-tokens",
        help=f"Tokens per request (default {GREEDY_MAX_TOKENS} greedy, {SAMPLED_MAX_TOKENS} "
        "sampled, where token positions 2..M are tested).",
    ),
    dataset_path: Path | None = typer.Option(
        None, "--dataset-path", help="A Spec-Bench-shaped JSONL file to take prompts from."
    ),
    prompts: int = typer.Option(
        4, "--prompts", help="Prompts taken from --dataset-path (or synthetic ones)."
    ),
    prompt: list[str] = typer.Option([], "--prompt", help="A prompt text (repeatable)."),
    alpha: float = typer.Option(
        0.01, "--alpha", help="Sampled: family-wise false-alarm rate, in (0, 1)."
    ),
    tolerance: float = typer.Option(
        0.0, "--tolerance", help="Greedy: share of prompts allowed to differ, in [0, 1]."
    ),
    seed: int = typer.Option(0, "--seed", help="First request seed; every request has its own."),
    concurrency: int = typer.Option(16, "--concurrency", help="Requests in flight per server."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds per request."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    output: Path | None = typer.Option(None, "--output", help="Write the JSON report here."),
) -> None:
    """Check that a server's speculative decoding does not change its outputs."""
    from speclens.bench.lossless import DEFAULT_MIN_EFFECT, LosslessConfig, Target, run_lossless

    number = "a number"
    tested, positions_problem = parse_positions(positions) if positions else (None, None)
    check([
        positions_problem,
        None if positions is None or temperature > 0 else
        "command line: --positions: expected only with a sampled test (--temperature > 0)",
        None if not tested or max_tokens is None or tested[-1] <= max_tokens else
        f"command line: --positions: position {tested[-1]} is beyond --max-tokens {max_tokens}",
        range_problem("--min-effect", min_effect, 0, above=True, high=1, kind=number),
        url_problem(url),
        _reference_url_problem(reference_url),
        range_problem("--temperature", temperature, 0, high=2, kind=number),
        range_problem("--top-k", top_k, 1),
        range_problem("--samples", samples, 2),
        range_problem("--max-tokens", max_tokens, 2 if temperature > 0 else 1),
        range_problem("--prompts", prompts, 1),
        None if 0 < alpha < 1 else f"command line: --alpha: expected a number in (0, 1), got {alpha:g}",
        range_problem("--tolerance", tolerance, 0, high=1, kind=number),
        range_problem("--seed", seed, 0),
        range_problem("--concurrency", concurrency, 1),
        range_problem("--timeout", timeout, 0, above=True, kind=number),
    ])  # fmt: skip
    if prompt and dataset_path is not None:
        fail("command line: --prompt: give --prompt or --dataset-path, not both", code=2)
    if any(not p for p in prompt):
        fail("command line: --prompt: expected a non-empty text", code=2)
    if output is not None:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.touch()
        except OSError as exc:
            fail(
                f"command line: --output: cannot write to {str(output)!r}: {exc.strerror or exc}",
                code=2,
            )
    with reported():
        texts = _prompts(prompt, dataset_path, prompts, seed)
    if not texts:
        fail(f"{dataset_path}: no prompts in the file")
    tokens = max_tokens or (tested[-1] if tested else None)
    tokens = tokens or (GREEDY_MAX_TOKENS if temperature == 0 else SAMPLED_MAX_TOKENS)
    effect = DEFAULT_MIN_EFFECT if min_effect is None else min_effect
    if samples is None and min_effect is not None and temperature > 0:
        planned = len(texts) * (len(tested) if tested else tokens - 1)
        samples = sized_samples(effect, alpha, max(1, planned), top_k)
        if samples > MAX_SIZED_SAMPLES:
            fail(
                f"command line: --min-effect: {effect:g} needs {samples} samples per prompt and "
                f"server, above {MAX_SIZED_SAMPLES}: expected a larger effect",
                code=2,
            )
        if not json_out:
            out_console.print(
                f"--min-effect {effect:g}: {samples} samples per prompt and server", markup=False
            )
    config = LosslessConfig(
        server=Target(url, model, api_key),
        reference=Target(reference_url, reference_model or model, reference_api_key),
        prompts=texts,
        endpoint=endpoint.value,
        temperature=temperature,
        samples=samples or DEFAULT_SAMPLES,
        max_tokens=tokens,
        alpha=alpha,
        tolerance=tolerance,
        top_k=top_k,
        seed=seed,
        concurrency=concurrency,
        timeout=timeout,
        positions=tested,
        min_effect=effect,
    )
    report = run_lossless(config)
    data = {"server": url, "reference": reference_url, **report.to_dict()}
    if output is not None:
        output.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    if json_out:
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
    else:
        _print(report, url, reference_url)
    if report.failed_requests:
        raise typer.Exit(REQUESTS_FAILED)
    if report.verdict != "pass":
        raise typer.Exit(FLAGGED if report.verdict == "flagged" else INCONCLUSIVE)
