"""``speclens measure``: turn a natural-acceptance run into a registry profile set.

Loads a server that speculates without forcing acceptance with a category-tagged prompt set, and
writes one ``measured`` profile per category: the token-weighted AL (and the draft coverage, when
the engine reports its decode steps), with provenance filled from
what was observed (the prompt file, how many prompts, the server's hardware and engine version,
the sampling settings, K and the method). The output validates and resolves like any set.

Every profile rests on the verify steps its category's requests reported: the output names them
(and the set's caveats keep them); a category under ``--min-verify-steps`` gets no profile and is
named, and a run where no category reaches it writes nothing (exit 4, inconclusive).

A profile carries its category's spread between requests (per-request AL quantiles weighted by
verify steps, ``figures.acceptance`` ``per_request``) when it rests on at least
``spread.MIN_REQUESTS`` requests, with a tolerance that covers the gap between the quantiles'
implied mean and the AL; fewer requests, or a gap past ``spread.MAX_TOLERANCE``: no spread, and
the output names the category and why. ``speclens profiles from-run`` writes a set from a bench
run's directory through the same functions.

Exit codes follow ``speclens bench``: 2 bad options, 3 more failed requests than
``--max-failure-rate`` allows (no profile set is written from such a run), 4 no category with
enough verify steps (nothing written), 130 interrupted.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml

from speclens.acceptance.spread import (
    DEFAULT_TOLERANCE,
    LEVEL_NAMES,
    MAX_TOLERANCE,
    MIN_REQUESTS,
    implied_mean,
    quantile_problems,
)
from speclens.cli._common import err_console, fail, out_console, reported
from speclens.cli.bench import MAX_FAILURE_RATE_OPTION, check, range_problem, url_problem

if TYPE_CHECKING:
    from speclens.bench.datasets import Prompt
    from speclens.bench.run import BenchOutcome
    from speclens.runs.request import RequestRecord

INCONCLUSIVE = 4  # no category had the verify steps a profile needs
DEFAULT_MIN_VERIFY_STEPS = 1  # a profile needs at least one verify step


def _writable(output: Path) -> str | None:
    """One line when the profile set could not be written, found before the run, not after."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if output.is_dir():
            raise IsADirectoryError(21, "is a directory")
        with tempfile.NamedTemporaryFile(dir=output.parent, prefix=".speclens-probe-"):
            pass
    except OSError as exc:
        return f"command line: --output: cannot write to {str(output)!r}: {exc.strerror or exc}"
    return None


def _engine(info: dict[str, Any], counters: dict[str, Any] | None) -> str:
    """The engine's name: ``/version``'s ``engine`` (speclens serve), else by the counters it
    exposes (vLLM's ``/version`` is ``{"version": ...}`` alone), else unknown."""
    from speclens.bench.run import serving_engine

    named = info.get("engine")
    if isinstance(named, str) and named:
        return named
    return serving_engine(info, "", (counters, None)) or "unknown engine"


def _k_from_counters(counters: dict[str, Any] | None) -> int | None:
    """K from vLLM's per-position counter (``bench.run.counter_k``)."""
    from speclens.bench.run import counter_k

    return counter_k(counters)


def _agreed(flag: str, given: Any, reported: Any) -> Any:
    """The flag's value, or the server's; both given and different is a usage error."""
    if given is not None and reported is not None and given != reported:
        fail(f"command line: {flag}: the server reports {reported!r}, got {given!r}", code=2)
    return given if given is not None else reported


def measure(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="The server's base URL."),
    model: str = typer.Option(..., "--model", help="The served model name."),
    catalog_model: str | None = typer.Option(
        None, "--catalog-model", help="The model's catalog name in the profiles (default: --model)."
    ),
    dataset_path: Path = typer.Option(
        ...,
        "--dataset-path",
        exists=True,
        dir_okay=False,
        help="A Spec-Bench-shaped JSONL file (question_id, category, turns).",
    ),
    category: list[str] = typer.Option(
        [], "--category", help="Only these categories (repeatable)."
    ),
    prompts_per_category: int | None = typer.Option(
        None, "--prompts-per-category", help="Use the first N prompts of each category."
    ),
    thinking: str = typer.Option(
        "off", "--thinking", help="The thinking mode the profiles are for."
    ),
    endpoint: str = typer.Option("chat", "--endpoint", help="chat or completions."),
    max_tokens: int = typer.Option(128, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature"),
    concurrency: int = typer.Option(8, "--concurrency"),
    hardware: str | None = typer.Option(
        None, "--hardware", help="The chip (default: what the server's /version reports)."
    ),
    method: str | None = typer.Option(
        None,
        "--method",
        help="The server's speculative method (default: what its /version reports; vLLM's does not).",
    ),
    num_spec_tokens: int | None = typer.Option(
        None,
        "--num-spec-tokens",
        help="K (default: /version, or the positions of vLLM's per-position counter).",
    ),
    name: str | None = typer.Option(
        None, "--name", help="The set's name (default: the output file's name)."
    ),
    source: str | None = typer.Option(
        None, "--source", help="Cited source (default: the prompt file's name and the server)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Write the profile set here."),
    max_failure_rate: float = MAX_FAILURE_RATE_OPTION,
    min_verify_steps: int = typer.Option(
        DEFAULT_MIN_VERIFY_STEPS,
        "--min-verify-steps",
        help="A category needs this many verify steps for a profile; fewer: none, and it is named.",
    ),
) -> None:
    """Measure natural acceptance per category and write a profile set."""
    check([
        url_problem(url),
        None if endpoint in ("chat", "completions") else
        f"command line: --endpoint: expected chat or completions, got {endpoint!r}",
        range_problem("--prompts-per-category", prompts_per_category, 1),
        range_problem("--max-tokens", max_tokens, 1),
        range_problem("--temperature", temperature, 0, kind="a number"),
        range_problem("--concurrency", concurrency, 1),
        range_problem("--num-spec-tokens", num_spec_tokens, 1),
        None if method is None or method.strip() else
        "command line: --method: expected a method name, got ''",
        range_problem("--max-failure-rate", max_failure_rate, 0, high=1, kind="a number"),
        range_problem("--min-verify-steps", min_verify_steps, 1),
        _writable(output),
    ])  # fmt: skip
    prompts = _select(dataset_path, category, prompts_per_category)
    served = _served(url, model, method, num_spec_tokens, hardware)
    outcome = _run(url, model, endpoint, prompts, concurrency, max_tokens, temperature,
                   max_failure_rate, output)  # fmt: skip
    acceptance = outcome.summary["figures"]["acceptance"]
    _check_acceptance(acceptance, outcome.summary.get("engine"))
    counts = prompt_counts(outcome.records)
    base = provenance(
        served, url, model, dataset_path.name, source, endpoint, max_tokens, temperature
    )
    write_set(
        SetPlan(acceptance["al_by_category"], counts, base, catalog_model or model, served,
                thinking, min_verify_steps, None),
        output, name, measured_on(sum(counts.values()), dataset_path.name, max_tokens,
                                   temperature), "measure",
    )  # fmt: skip


def _select(dataset_path: Path, category: list[str], per_category: int | None) -> list[Prompt]:
    """The prompt file's prompts, of ``category`` when given, the first ``per_category`` each."""
    from speclens.bench.datasets import jsonl_prompts

    with reported():
        prompts = jsonl_prompts(dataset_path, category or None)
    if per_category is None:
        return prompts
    seen: dict[str, int] = {}
    kept = []
    for prompt in prompts:
        seen[prompt.category] = seen.get(prompt.category, 0) + 1
        if seen[prompt.category] <= per_category:
            kept.append(prompt)
    return kept


@dataclass
class Served:
    """What the server says about itself, agreed with the flags."""

    info: dict[str, Any]
    engine: str
    method: str
    k: int
    chip: str


def _served(
    url: str, model: str, method: str | None, num_spec_tokens: int | None, hardware: str | None
) -> Served:
    """The server's engine, method, K and chip; refuses a forced server and missing facts."""
    from speclens.bench.server import read_counters, served_speculation, server_info

    info = asyncio.run(server_info(url)) or {}
    served = served_speculation(info)
    if served.get("forced"):
        fail(
            "the server forces acceptance: measure needs natural acceptance (start it without --spec-decode-acceptance-*)"
        )
    counters, _why = asyncio.run(read_counters(url, model=model))
    engine = _engine(info, counters)
    spec_method = _agreed("--method", method, served.get("method"))
    k = _agreed(
        "--num-spec-tokens",
        num_spec_tokens,
        served.get("num_speculative_tokens") or _k_from_counters(counters),
    )
    if not spec_method or not k:
        fail(
            f"the server ({engine}) does not report its speculative method and K: give --method and --num-spec-tokens",
            code=2,
        )
    chip = hardware or info.get("hardware")
    if not chip:
        fail("give --hardware: the server does not report it", code=2)
    return Served(info, engine, str(spec_method), int(k), str(chip))


def _run(
    url: str, model: str, endpoint: str, prompts: list[Prompt], concurrency: int,
    max_tokens: int, temperature: float, max_failure_rate: float, output: Path,
) -> BenchOutcome:  # fmt: skip
    """The load; too many failed requests (or an interrupt) end the command here."""
    from speclens.bench.client import LoadConfig
    from speclens.bench.run import EXIT_OK, run_bench

    config = LoadConfig(
        url=url, model=model, endpoint=endpoint, num_requests=len(prompts),  # type: ignore[arg-type]
        concurrency=concurrency, max_tokens=max_tokens, temperature=temperature,
    )  # fmt: skip
    outcome = asyncio.run(
        run_bench(config, prompts, expect_spec=True, max_failure_rate=max_failure_rate)
    )
    if outcome.exit_code != EXIT_OK:
        fails = outcome.summary["failures"]
        fail(
            [
                f"measure: {fails['failed']} of {fails['sent']} requests failed "
                f"(max {max_failure_rate * 100:g}%)"
                + (", interrupted" if outcome.summary["figures"]["interrupted"] else "")
                + f": no profile set written to {output}",
                *(f"  {row['error']} (x{row['count']})" for row in fails["first_errors"]),
            ],
            code=outcome.exit_code,
        )
    return outcome


def _check_acceptance(acceptance: dict[str, Any], engine: str | None) -> None:
    """Refuse a run whose requests carried no per-request stats (naming the switch that turns
    them on for the serving ``engine``), or counts without steps."""
    from speclens.bench.run import stats_hint

    if not acceptance["requests_with_stats"]:
        fail(f"no request carried per-request speculative-decoding stats: {stats_hint(engine)}")
    if acceptance["counts_only_requests"] and not acceptance["verify_steps"]:
        engines = ", ".join(acceptance["counts_only_engines"])
        fail(
            f"measure: every request carried counts only ({engines}): no verify steps per "
            "request, so no AL per category; `speclens bench` reports the run's AL from the "
            "server's counters"
        )


def prompt_counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    """The prompts each category's AL pools (counts-only requests and warm-ups do not)."""
    counts: dict[str, int] = {}
    for record in records:
        stepped = record.spec is not None and record.spec.get("num_spec_steps") is not None
        if stepped and not record.warmup:
            counts[record.category] = counts.get(record.category, 0) + 1
    return counts


def provenance(
    served: Served, url: str, model: str, dataset: str, source: str | None,
    endpoint: str | None, max_tokens: int | None, temperature: float,
) -> dict[str, Any]:  # fmt: skip
    """What every profile's provenance shares: the source, hardware, engine and settings (a
    setting the run did not record is left out)."""
    version = served.info.get("version")
    sampling: dict[str, Any] = {"temperature": temperature}
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    settings = {"rejection_sample_method": "greedy" if temperature == 0 else "probabilistic",
                "endpoint": endpoint, "model": model}  # fmt: skip
    base: dict[str, Any] = {
        "source": source or f"{dataset} via {served.engine} {version} at {url}",
        "benchmark": dataset,
        "hardware": served.chip,
        "engine_image": f"{served.engine}=={version}" if version else str(served.engine),
        "sampling": sampling,
        "settings": {key: value for key, value in settings.items() if value},
    }
    block = served.info.get("acceptance")
    served_block: dict[str, Any] = block if isinstance(block, dict) else {}
    for key in ("prompt_lookup_min", "prompt_lookup_max"):  # the n-gram lookup, when reported
        if type(served_block.get(key)) is int:
            base["settings"][key] = served_block[key]
    return base


@dataclass
class SetPlan:
    """What a measured profile set is written from: per category (``rows``, as
    ``figures.acceptance.al_by_category``) its AL, verify steps, draft coverage and per-request
    spread, and the prompts behind it; what every profile shares; ``spread_source``, the run a
    spread names (None: unnamed)."""

    rows: dict[str, dict[str, Any]]
    counts: dict[str, int]
    base: dict[str, Any]
    model: str
    served: Served
    thinking: str
    min_verify_steps: int
    spread_source: str | None


def spread_of(
    block: object, al: float, k: int, source: str | None
) -> tuple[dict[str, Any] | None, str | None]:
    """A profile's ``spread`` from its requests' per-request AL distribution (a
    ``figures.acceptance`` ``per_request`` block) beside its (rounded) AL at K, or why none:
    fewer than ``spread.MIN_REQUESTS`` requests, or quantiles whose implied mean sits further
    from the AL than ``spread.MAX_TOLERANCE``. The tolerance stated covers that gap, rounded up
    to a hundredth, at least ``spread.DEFAULT_TOLERANCE``."""
    if block is None:
        return None, "no request with a verify step"
    if not isinstance(block, dict) or not isinstance(block.get("quantiles"), dict):
        return None, "the run's figures hold no per-request distribution"
    requests = block["requests"]
    if requests < MIN_REQUESTS:
        return None, f"{requests} requests, fewer than the {MIN_REQUESTS} a spread needs"
    quantiles = {name: round(float(block["quantiles"][name]), 4) for name in LEVEL_NAMES}
    values = list(quantiles.values())
    gap = abs(implied_mean(values) - al)
    tolerance = max(DEFAULT_TOLERANCE, math.ceil(round(gap * 100, 9)) / 100)
    if tolerance > MAX_TOLERANCE:
        return None, (
            f"its quantiles imply a mean AL of {implied_mean(values):.4f}, {gap:.4f} from the "
            f"AL {al:g}: beyond the widest tolerance {MAX_TOLERANCE:g}"
        )
    problems = quantile_problems(values, k, al, tolerance)
    if problems:
        return None, f"its quantiles {problems[0]}"
    spread: dict[str, Any] = {"num_spec_tokens": k, "quantiles": quantiles, "requests": requests,
                              "tolerance": tolerance}  # fmt: skip
    if source:
        spread["source"] = source
    return spread, None


def _profiles(plan: SetPlan) -> tuple[list[dict[str, Any]], list[str], dict[str, str]]:
    """One measured profile per category with at least ``min_verify_steps`` verify steps (with
    its spread where it has one), the categories left out for having fewer (zero included: no
    AL without evidence), and why each profile without a spread has none."""
    profiles, thin, spreadless = [], [], {}
    served = plan.served
    for cat, row in plan.rows.items():
        if row["verify_steps"] < plan.min_verify_steps:
            thin.append(cat)
            continue
        al = round(row["al"], 4)
        profiles.append({
            "model": plan.model, "speculative_method": served.method,
            "num_spec_tokens": served.k, "thinking": plan.thinking, "category": cat,
            "acceptance_length": al, "method": "measured",
            "provenance": {**plan.base, "prompts": plan.counts.get(cat, 0)},
        })  # fmt: skip
        if row.get("draft_coverage") is not None:  # engines that report steps without drafts
            profiles[-1]["draft_coverage"] = round(row["draft_coverage"], 4)
        block = row.get("per_request", "not in the figures")  # a summary written before it
        spread, why = spread_of(block, al, served.k, plan.spread_source)
        if spread is not None:
            profiles[-1]["spread"] = spread
        else:
            spreadless[cat] = str(why)
    return profiles, thin, spreadless


def measured_on(
    prompts: int, dataset: str, max_tokens: int | None, temperature: float
) -> str:  # fmt: skip
    """The set's first caveat: what the acceptance was measured over."""
    tokens = f"{max_tokens} output tokens" if max_tokens else "output tokens up to the server's cap"
    return (
        f"Measured with natural acceptance over {prompts} prompts of {dataset}, {tokens} at "
        f"temperature {temperature:g}."
    )


def write_set(
    plan: SetPlan, output: Path, name: str | None, head: str, command: str
) -> None:  # fmt: skip
    """The profile set of ``plan``, validated and written (``head``: its first caveat, what it
    was measured over), each profile's evidence printed; a category without enough verify
    steps, or without enough requests for a spread, is named (stderr, prefixed ``command``);
    none with enough verify steps writes nothing (exit 4)."""
    profiles, thin, spreadless = _profiles(plan)
    steps = {cat: row["verify_steps"] for cat, row in plan.rows.items()}
    for cat in thin:
        err_console.print(
            f"{command}: {cat}: {steps[cat]} verify steps, below --min-verify-steps "
            f"{plan.min_verify_steps}: no profile",
            markup=False,
        )
    if not profiles:
        fail(f"{command}: inconclusive: no category has {plan.min_verify_steps} or more verify "
             f"steps: no profile set written to {output}", code=INCONCLUSIVE)  # fmt: skip
    caveats = [
        head,
        "Verify steps per category: "
        + ", ".join(f"{p['category']} {steps[p['category']]}" for p in profiles)
        + ".",
    ]
    spread = [p["category"] for p in profiles if "spread" in p]
    caveats.append(
        "Spread between requests (per-request AL quantiles, each request weighted by its "
        f"verify steps; at least {MIN_REQUESTS} requests): "
        + (f"stated for {', '.join(spread)}" if spread else "stated for no category")
        + (f"; not for {', '.join(f'{c} ({why})' for c, why in spreadless.items())}"
           if spreadless else "") + "."
    )  # fmt: skip
    document = {"kind": "AcceptanceProfileSet", "name": name or output.stem,
                "caveats": caveats, "profiles": profiles}  # fmt: skip
    _write(document, output)
    for p in profiles:
        covered = f", draft coverage {p['draft_coverage']}" if "draft_coverage" in p else ""
        out_console.print(
            f"{p['category']}: AL {p['acceptance_length']}{covered} over "
            f"{steps[p['category']]} verify steps in {p['provenance']['prompts']} prompts"
            + (f"; {spread_line(p['spread'])}" if "spread" in p else ""),
            markup=False,
            soft_wrap=True,
        )
    for cat, why in spreadless.items():
        err_console.print(f"{command}: {cat}: no spread: {why}", markup=False)
    out_console.print(
        f"wrote {output} ({len(profiles)} measured profiles, {len(spread)} with a spread)",
        markup=False,
        soft_wrap=True,
    )


def spread_line(spread: dict[str, Any]) -> str:
    """A written spread in a few words: p10, p50 and p90, its requests and tolerance."""
    q = spread["quantiles"]
    return (
        f"spread p10 {q['p10']:g}, p50 {q['p50']:g}, p90 {q['p90']:g} over "
        f"{spread['requests']} requests (tolerance {spread['tolerance']:g})"
    )


class _Plain(yaml.SafeDumper):
    """Every profile's provenance written out in full: the profiles share one dict of settings,
    which the default dumper would write once and refer to by a YAML anchor."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _write(document: dict[str, Any], output: Path) -> None:
    """Validate the set as any registry file is, then write it."""
    from speclens.acceptance import AcceptanceProfileSet, validate

    with reported():
        validate(AcceptanceProfileSet, document, str(output))
    output.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(document, Dumper=_Plain, sort_keys=False, width=100)
    output.write_text(text, encoding="utf-8")
