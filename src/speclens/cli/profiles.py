"""``speclens profiles``: validate, list, resolve, schema and import acceptance profiles, and
write a measured set from a bench run (``from-run``)."""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from speclens.acceptance import (
    MAX_NUM_SPEC_TOKENS,
    AcceptancePin,
    AcceptanceProfileSet,
    Problem,
    Resolution,
    ValidationError,
    WorkloadAcceptance,
    accepted_count_distribution,
    load_sets,
    read_yaml,
    resolve,
    validate,
)
from speclens.acceptance.emit import ENGINES, emit
from speclens.acceptance.files import key_mark, parse_yaml, read_checked_text
from speclens.acceptance.golden import GoldenHeader, method_from_name, read_header
from speclens.acceptance.quantity import (
    is_finite_number,
    length_problems,
    num_spec_tokens_problem,
)
from speclens.acceptance.schema import CATEGORY_PATTERN
from speclens.acceptance.spread import SPREAD_UNKNOWN
from speclens.cli._common import (
    ACCEPTANCE_LENGTH_OPTION,
    ACCEPTANCE_RATE_OPTION,
    PER_POSITION_RATES_OPTION,
    REGISTRY_OPTION,
    cli_value,
    err_console,
    fail,
    load_registry,
    num_spec_tokens_callback,
    out_console,
    reported,
)

if TYPE_CHECKING:
    from speclens.cli.measure import Served
    from speclens.runs.request import RequestRecord
    from speclens.runs.rundir import Run

app = typer.Typer(
    help="Acceptance-profile sets: validate, list, resolve, schema, import, from-run.",
    no_args_is_help=True,
)


class Thinking(StrEnum):
    on = "on"
    off = "off"


class ProfileMethodChoice(StrEnum):
    measured = "measured"
    copied = "copied"
    assumed = "assumed"


@app.command("validate")
def validate_cmd(
    paths: list[Path] = typer.Argument(..., help="Profile-set files or registry directories."),
) -> None:
    """Validate profile sets; exit 1 listing every problem in every file."""
    with reported():
        sets = load_sets(paths)
    for s in sets:
        out_console.print(f"{s.path}: ok ({s.name}, {len(s.profile_set.profiles)} profiles)")


@app.command("list")
def list_cmd(registry: list[Path] = REGISTRY_OPTION) -> None:
    """Every profile in the registry, one row each."""
    with reported():
        reg = load_registry(registry)
    table = Table("set", "model", "spec method", "K", "thinking", "category", "AL", "method")
    for s in reg:
        for p in s.profile_set.profiles:
            table.add_row(
                s.name,
                p.model,
                p.speculative_method,
                str(p.num_spec_tokens),
                p.thinking,
                p.category,
                f"{p.acceptance_length:g}",
                p.method,
            )
    out_console.print(table)


@app.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of a profile-set file (for editors)."""
    schema = AcceptanceProfileSet.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    typer.echo(json.dumps(schema, indent=2))


def _workload(
    path: Path | None, thinking: Thinking | None, category: str | None
) -> WorkloadAcceptance:
    data: dict[str, Any] = {}
    if path is not None:
        raw = read_yaml(path)
        base = validate(WorkloadAcceptance, raw, str(path))
        data = base.model_dump(exclude_none=True)
    for name, given in (("thinking", thinking.value if thinking else None), ("category", category)):
        if given is None:
            continue
        if name in data and data[name] != given:
            fail(f"--{name} {given} contradicts the workload file's {name}: {data[name]}", code=2)
        data[name] = given
    return validate(WorkloadAcceptance, data, "command line")


def _pin(path: Path | None) -> AcceptancePin | None:
    if path is None:
        return None
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ValidationError([Problem(str(path), "(document)", "expected a mapping")])
    if "acceptance" not in data:
        return None
    return validate(AcceptancePin, data["acceptance"], str(path), prefix="acceptance")


def describe(res: Resolution) -> list[tuple[str, str]]:
    """The resolution as labelled lines, for people."""
    rows = [
        ("acceptance length", f"{res.acceptance_length:g}"),
        ("acceptance rate", f"{res.acceptance_rate:.4f} at K {res.num_spec_tokens}"),
        (
            "per-position rates",
            f"{res.per_position_rates}"
            + ("  (derived: minimum-variance schedule)" if res.rates_derived else "  (stated)"),
        ),
        (
            "accepted drafts",
            ", ".join(
                f"{j}: {p:.0%}"
                for j, p in accepted_count_distribution(res.per_position_rates).items()
            ),
        ),
        (
            "draft coverage",
            f"{res.draft_coverage:g} of decode steps draft"
            + ("  (stated)" if res.draft_coverage_stated else "  (not stated: every step drafts)"),
        ),
        ("layer", res.layer),
    ]
    if res.profile:
        rows.append(("profile", f"{res.profile_set}: {res.profile} ({res.method})"))
    if res.fallback_used:
        rows.append(("fallback", f"category {res.fallback_category or '(none)'} -> {res.category}"))
    rows.append(("spread", spread_text(res)))
    if res.source:
        rows.append(("source", res.source))
    if res.measured_on:
        rows.append(
            ("measured on", f"{res.measured_on} (not the run's hardware, or it is unknown)")
        )
    return rows


def spread_text(res: Resolution) -> str:
    """The resolution's spread between requests in one line (its p10, p50 and p90, the requests
    behind them), or ``SPREAD_UNKNOWN``: wherever tails are printed, they say what they rest on."""
    spread = res.spread
    if spread is None:
        return SPREAD_UNKNOWN
    q = spread.quantiles
    measured = f", measured on {spread.source}" if spread.source else ""
    return (
        f"per-request AL p10 {q['p10']:g}, p50 {q['p50']:g}, p90 {q['p90']:g} over "
        f"{spread.requests:,} requests (p0 {q['p0']:g} to p100 {q['p100']:g}, each weighted "
        f"by its verify steps{measured})"
    )


def print_resolution(res: Resolution) -> None:
    table = Table.grid(padding=(0, 2))
    for label, value in describe(res):
        table.add_row(f"[bold]{label}[/]", escape(value))
    out_console.print(table)


@app.command("resolve")
def resolve_cmd(
    model: str = typer.Option(..., "--model", help="The catalog model name."),
    method: str = typer.Option(..., "--method", help="The speculative method (e.g. dspark, mtp)."),
    num_spec_tokens: int = typer.Option(
        ...,
        "--num-spec-tokens",
        "-k",
        help="K, draft tokens per step, in [1, 64].",
        callback=num_spec_tokens_callback,
    ),
    thinking: Thinking | None = typer.Option(
        None, "--thinking", help="The workload's thinking mode."
    ),
    category: str | None = typer.Option(None, "--category", help="The workload's category."),
    hardware: str | None = typer.Option(
        None, "--hardware", help="The run's chip, recorded against the profile's."
    ),
    scenario: Path | None = typer.Option(
        None,
        "--scenario",
        exists=True,
        dir_okay=False,
        help="A scenario file; its acceptance pin is used.",
    ),
    workload: Path | None = typer.Option(
        None,
        "--workload",
        exists=True,
        dir_okay=False,
        help="A workload file: thinking, category, acceptance.",
    ),
    acceptance_length: float | None = ACCEPTANCE_LENGTH_OPTION,
    acceptance_rate: float | None = ACCEPTANCE_RATE_OPTION,
    per_position_rates: str | None = PER_POSITION_RATES_OPTION,
    registry: list[Path] = REGISTRY_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print the resolution as one JSON object."),
    emit_engine: str | None = typer.Option(
        None,
        "--emit",
        help="Print the one line that forces it in vllm, atom, sglang or trtllm (notes go to "
        "stderr).",
    ),
) -> None:
    """Resolve the acceptance a run uses and say where it came from."""
    if emit_engine is not None and emit_engine not in ENGINES:
        fail(f"command line: --emit: expected {', '.join(ENGINES)}, got {emit_engine!r}", code=2)
    if emit_engine is not None and as_json:
        fail("command line: --emit: prints one line; do not also give --json", code=2)
    with reported():
        res = resolve(
            model=model,
            method=method,
            num_spec_tokens=num_spec_tokens,
            hardware=hardware,
            registry=load_registry(registry),
            workload=_workload(workload, thinking, category),
            scenario=_pin(scenario),
            cli=cli_value(num_spec_tokens, acceptance_length, acceptance_rate, per_position_rates),
        )
        emission = emit(res, emit_engine, method) if emit_engine is not None else None
    if emission is not None:
        for note in emission.notes:
            err_console.print(f"note: {note}", markup=False)
        typer.echo(emission.line)
    elif as_json:
        typer.echo(json.dumps(res.model_dump()))
    else:
        print_resolution(res)


#: A K key of an InferenceX curve: a plain decimal integer, ASCII digits, no sign, space or
#: leading zero, so that two spellings (1 and 01, 2 and +2, 2 and the Arabic-Indic digit two)
#: can never name one K and silently keep the last.
_K_KEY = re.compile(r"[1-9][0-9]*", re.ASCII)
_SHAPE = "expected {model: {thinking_on|thinking_off: {K: AL}}}"


def _where(mapping: object, key: object, fallback: str) -> str:
    """A key that is not what it should be is located by its line and column, never quoted:
    the file may be something else entirely (its lines are then its keys)."""
    mark = key_mark(mapping, key)
    return str(mark) if mark is not None else fallback


def _parse_inferencex(data: Any, file: str) -> dict[tuple[str, str, int], float]:
    """``{model: {thinking_on|thinking_off: {K: AL}}}`` -> {(model, on|off, K): AL}."""
    if not isinstance(data, dict) or not data:
        raise ValidationError([Problem(file, "(document)", _SHAPE)])
    out: dict[tuple[str, str, int], float] = {}
    problems: list[Problem] = []
    for n, (model, modes) in enumerate(data.items(), 1):
        if not isinstance(model, str) or not isinstance(modes, dict) or not modes:
            where = _where(data, model, f"model {n}")
            problems.append(Problem(file, where, f"{_SHAPE}: this key is not a model's curves"))
            continue
        if model in ("thinking_on", "thinking_off"):
            where = _where(data, model, f"model {n}")
            problems.append(
                Problem(file, where, f"{_SHAPE}: a thinking mode where a model belongs")
            )
            continue
        name = reprlib.repr(model)[1:-1]
        for mode, curve in modes.items():
            if mode not in ("thinking_on", "thinking_off"):
                where = f"{name}: {_where(modes, mode, 'a key')}"
                problems.append(Problem(file, where, "expected thinking_on or thinking_off"))
                continue
            if not isinstance(curve, dict) or not curve:
                problems.append(Problem(file, f"{name}.{mode}", "expected a mapping of K to AL"))
                continue
            for k_int, al in _curve(curve, f"{name}.{mode}", file, problems).items():
                out[(model, mode.removeprefix("thinking_"), k_int)] = al
    if problems:
        raise ValidationError(problems)
    return out


def _curve(
    curve: dict[Any, Any], path: str, file: str, problems: list[Problem]
) -> dict[int, float]:
    """One ``{K: AL}`` curve; each key must be a plain decimal K in [1, MAX_NUM_SPEC_TOKENS],
    given once. Problems are appended to ``problems``."""
    out: dict[int, float] = {}
    first: dict[int, str] = {}
    for n, (k, al) in enumerate(curve.items(), 1):
        where = _where(curve, k, f"key {n}")
        mark = key_mark(curve, k)
        text = mark.text if mark is not None and mark.text is not None else k
        if isinstance(k, bool) or not isinstance(k, int | str) or not isinstance(text, int | str):
            problems.append(
                Problem(file, f"{path}: {where}", "expected K, a plain decimal integer")
            )
            continue
        text = str(text) if isinstance(text, int) else text
        if not _K_KEY.fullmatch(text):
            message = "expected K, a plain decimal integer such as 4 (no sign, space or leading 0)"
            problems.append(Problem(file, f"{path}: {where}", message))
            continue
        too_long = f"must be at most {MAX_NUM_SPEC_TOKENS}, got a {len(text)}-digit number"
        problem = num_spec_tokens_problem(int(text)) if len(text) <= 4 else too_long
        if problem:
            at = f"{path}.{text}" if len(text) <= 4 else f"{path}: {where}"
            problems.append(Problem(file, at, f"K {problem}"))
            continue
        k_int = int(text)
        if k_int in first:
            message = f"K {k_int} is given twice (also at {first[k_int]}): give each K once"
            problems.append(Problem(file, f"{path}.{k_int}", message))
            continue
        first[k_int] = where
        if not is_finite_number(al):
            message = f"AL {reprlib.repr(al)} is not a finite number"
            problems.append(Problem(file, f"{path}.{k_int}", message))
            continue
        range_problems = length_problems(float(al), k_int)
        if range_problems:
            problems.append(Problem(file, f"{path}.{k_int}", f"AL {range_problems[0]}"))
            continue
        out[k_int] = float(al)
    return out


def _key_value(pairs: list[str], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            fail(f"command line: {option}: expected NAME=VALUE, got {pair!r}", code=2)
        out[name.strip()] = value.strip()
    return out


def _methods(values: list[str], files: list[Path]) -> dict[str, str]:
    """``--speculative-method``: NAME for every file (key ""), or FILE_NAME=NAME for one."""
    out: dict[str, str] = {}
    known = {f.name for f in files}
    for value in values:
        file_name, sep, method = value.rpartition("=")
        method = method.strip()
        if not method or (sep and file_name not in known):
            fail(
                f"command line: --speculative-method: expected METHOD or FILE_NAME=METHOD "
                f"naming one of the files given, got {value!r}",
                code=2,
            )
        out[file_name if sep else ""] = method
    return out


@dataclass(frozen=True)
class _Flags:
    """The provenance facts given on the command line; each overrides the header's."""

    run: str | None
    benchmark: str | None
    prompts: int | None
    hardware: str | None
    engine_image: str | None
    tp: int | None
    sampling: dict[str, float | int]
    settings: dict[str, str]


def _golden_provenance(
    source: str, header: GoldenHeader, mode: str, flags: _Flags
) -> dict[str, Any]:
    """One thinking mode's provenance: the header's facts, each replaced by its option."""
    engine = (
        f"{header.engine} (release not stated in the file; the run records it)"
        if header.engine
        else None
    )
    provenance: dict[str, Any] = {"source": source}
    for key, value in (
        ("run", flags.run or header.run),
        ("benchmark", flags.benchmark or header.benchmark),
        ("prompts", flags.prompts),
        ("hardware", flags.hardware or header.hardware),
        ("engine_image", flags.engine_image or engine),
        ("tp", flags.tp),
    ):
        if value is not None:
            provenance[key] = value
    sampling = {**header.sampling, **header.mode_sampling.get(mode, {}), **flags.sampling}
    if sampling:
        order = ("temperature", "top_p", "top_k", "max_tokens")
        provenance["sampling"] = {k: sampling[k] for k in order if k in sampling}
    settings: dict[str, Any] = {}
    if header.drafter:
        settings["drafter"] = header.drafter
    settings.update(header.settings)
    settings.update(header.mode_settings.get(mode, {}))
    settings.update(flags.settings)
    if settings:
        provenance["settings"] = settings
    return provenance


def _check_facts(
    file: str, spec: str | None, method: str, provenances: dict[str, dict[str, Any]]
) -> None:
    """A fact that neither the header nor an option gives is named, one line each."""
    problems: list[Problem] = []
    if spec is None:
        problems.append(
            Problem(
                file,
                "speculative_method",
                "neither the header nor the file name states it: pass --speculative-method",
            )
        )
    if method == "measured":
        options = {
            "hardware": "--hardware",
            "engine_image": "--engine-image",
            "sampling": "--temperature",
        }
        for field_name, option in options.items():
            missing = [m for m, p in provenances.items() if field_name not in p]
            if not missing:
                continue
            what = "temperature" if field_name == "sampling" else field_name
            modes = ", ".join(f"thinking_{m}" for m in missing)
            problems.append(
                Problem(
                    file,
                    field_name,
                    f"the header states no {what} (for {modes}), which method measured requires: "
                    f"pass {option}",
                )
            )
        for mode, provenance in provenances.items():
            sampling = provenance.get("sampling")
            if sampling is not None and "temperature" not in sampling:
                problems.append(
                    Problem(
                        file,
                        f"sampling.thinking_{mode}.temperature",
                        "the header states none, which method measured requires: "
                        "pass --temperature",
                    )
                )
    if problems:
        raise ValidationError(problems)


#: Every imported golden set says what its files leave out: the spread between requests.
NO_SPREAD_CAVEAT = (
    "The golden files publish each curve's mean AL only, no spread between requests: a "
    "resolution from this set has none, so tails forced or simulated with it are "
    "minimum-variance, optimistic."
)


@app.command("import-inferencex")
def import_inferencex_cmd(
    files: list[Path] = typer.Argument(
        ...,
        exists=True,
        dir_okay=False,
        help="InferenceX golden-curve YAML files; several make one set.",
    ),
    speculative_method: list[str] = typer.Option(
        [],
        "--speculative-method",
        help="The engine's method name (e.g. dspark), or FILE_NAME=METHOD for one file. "
        "Overrides the header. Repeatable.",
    ),
    category: str | None = typer.Option(
        None,
        "--category",
        help="The workload category (default: the header's dataset, else coding).",
    ),
    name: str | None = typer.Option(
        None, "--name", help="The set's name (default: the output file's name)."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the set here (default: stdout)."
    ),
    method: ProfileMethodChoice = typer.Option(
        ProfileMethodChoice.measured, "--method", help="How the values were obtained."
    ),
    rationale: str | None = typer.Option(
        None, "--rationale", help="Why, when the method is not measured."
    ),
    copied_from: str | None = typer.Option(
        None,
        "--copied-from",
        help="With --method copied: model/method/k<K>/thinking-<mode>/category.",
    ),
    source: str | None = typer.Option(
        None, "--source", help="The document the values were read from (default: FILE as given)."
    ),
    source_base: str | None = typer.Option(
        None,
        "--source-base",
        help="The upstream folder's URL; each file's source is it followed by the file's name.",
    ),
    run: str | None = typer.Option(
        None, "--run", help="The job that measured them (default: the header's run)."
    ),
    benchmark: str | None = typer.Option(
        None, "--benchmark", help="The prompt set (default: the header's, e.g. SPEED-Bench)."
    ),
    prompts: int | None = typer.Option(None, "--prompts", help="How many prompts."),
    hardware: str | None = typer.Option(
        None, "--hardware", help="The chip (default: the header's; required for measured)."
    ),
    engine_image: str | None = typer.Option(
        None,
        "--engine-image",
        help="The engine image or release (default: the header's engine; required for measured).",
    ),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel width."),
    temperature: float | None = typer.Option(
        None,
        "--temperature",
        help="Sampling temperature (default: the header's; required for measured).",
    ),
    top_p: float | None = typer.Option(None, "--top-p"),
    top_k: int | None = typer.Option(None, "--top-k"),
    max_tokens: int | None = typer.Option(None, "--max-tokens"),
    setting: list[str] = typer.Option(
        [], "--setting", help="NAME=VALUE engine setting that bears on acceptance. Repeatable."
    ),
    caveat: list[str] = typer.Option([], "--caveat", help="A caveat for the set. Repeatable."),
    rename: list[str] = typer.Option(
        [],
        "--model-name",
        help="SOURCE=CATALOG: the catalog name for a model in the file. Repeatable.",
    ),
) -> None:
    """Convert InferenceX golden-AL curve files into one validated profile set.

    The header comments give the run, benchmark, chip, engine, drafter, method and sampling;
    an option overrides the header."""
    names = _key_value(rename, "--model-name")
    settings = _key_value(setting, "--setting")
    methods = _methods(speculative_method, files)
    if source is not None and len(files) > 1:
        fail("command line: --source: names one file; with several, use --source-base", code=2)
    flags = _Flags(
        run=run,
        benchmark=benchmark,
        prompts=prompts,
        hardware=hardware,
        engine_image=engine_image,
        tp=tp,
        sampling={
            k: v
            for k, v in (
                ("temperature", temperature),
                ("top_p", top_p),
                ("top_k", top_k),
                ("max_tokens", max_tokens),
            )
            if v is not None
        },
        settings=settings,
    )
    profiles: list[dict[str, Any]] = []
    with reported():
        for file in files:
            text = read_checked_text(file)
            header, problems = read_header(text, str(file))
            if problems:
                raise ValidationError(problems)
            curves = _parse_inferencex(parse_yaml(text, str(file)), str(file))
            spec = methods.get(file.name, methods.get("")) or header.method
            spec = spec or method_from_name(file.name)
            base = source_base.rstrip("/") + "/" if source_base else None
            file_source = source or (base + file.name if base else str(file))
            modes = sorted({mode for _, mode, _ in curves})
            provenances = {
                mode: _golden_provenance(file_source, header, mode, flags) for mode in modes
            }
            _check_facts(str(file), spec, method.value, provenances)
            assert spec is not None  # checked above
            for (model, mode, k), al in sorted(curves.items()):
                profile: dict[str, Any] = {
                    "model": names.get(model, model),
                    "speculative_method": spec,
                    "num_spec_tokens": k,
                    "thinking": mode,
                    "category": category or header.category or "coding",
                    "acceptance_length": al,
                    "method": method.value,
                    "provenance": provenances[mode],
                }
                if rationale is not None:
                    profile["rationale"] = rationale
                if copied_from is not None:
                    profile["copied_from"] = copied_from
                profiles.append(profile)
        set_name = name or (output.stem if output else files[0].stem)
        document: dict[str, Any] = {"kind": "AcceptanceProfileSet", "name": set_name}
        document["caveats"] = [*caveat, NO_SPREAD_CAVEAT]
        document["profiles"] = profiles
        target = str(output) if output else "(output)"
        try:
            validate(AcceptanceProfileSet, document, target)
        except ValidationError as exc:
            hint = Problem(
                target,
                "",
                "the converted set is invalid: give the missing facts as options (see --help)",
            )
            raise ValidationError([*exc.problems, hint]) from None
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        out_console.print(f"wrote {output}: {len(profiles)} profiles")


# ------------------------------------------------------------------------------ from-run

#: The fields of a run's summary and records.jsonl rows that ``from-run`` reads (a row's raw
#: wire payloads are dropped as it is read).
_SUMMARY_FIELDS = ("settings", "server", "engine", "figures", "failures", "verdict")
_ROW_FIELDS = ("index", "category", "success", "row_error", "completion_tokens",
               "spec_decode_acceptance", "spec_decode_choices", "spec_decode_status",
               "spec_decode_adapter")  # fmt: skip


@app.command("from-run")
def from_run_cmd(
    run_dir: Path = typer.Argument(
        ..., help="A bench run's directory (summary.json, "
        "records.jsonl), run against a server with natural acceptance."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Write the profile set here."),
    category: str | None = typer.Option(
        None, "--category", help="Pool every request of the run into one profile of this "
        "category (default: a profile per category of the run)."
    ),
    catalog_model: str | None = typer.Option(
        None, "--catalog-model", help="The model's catalog name (default: the run's model)."
    ),
    thinking: Thinking = typer.Option(Thinking.off, "--thinking", help="The thinking mode."),
    method: str | None = typer.Option(
        None, "--method", help="The speculative method (default: what the run's server reported)."
    ),
    num_spec_tokens: int | None = typer.Option(
        None, "--num-spec-tokens", help="K (default: the requests', else the server's)."
    ),
    hardware: str | None = typer.Option(
        None, "--hardware", help="The chip (default: what the run's server reported)."
    ),
    name: str | None = typer.Option(
        None, "--name", help="The set's name (default: the output file's name)."
    ),
    source: str | None = typer.Option(
        None, "--source", help="Cited source (default: the run's prompts and server)."
    ),
    min_verify_steps: int = typer.Option(
        1, "--min-verify-steps",
        help="A category needs this many verify steps for a profile; fewer: none, and it is named.",
    ),
) -> None:  # fmt: skip
    """Write a measured profile set from a bench run with natural acceptance, each profile with
    its spread between requests where it rests on enough of them.

    Exit codes as speclens measure's: 1 an invalid run file, 2 a run that cannot give a
    measured profile (forced, aggregate-only, no per-request stats) or a bad option, 3 a run
    with more failed requests than it allowed, 4 no category with enough verify steps; nothing
    is written unless the exit code is 0."""
    from speclens.cli import measure as m
    from speclens.cli.bench import check, range_problem
    from speclens.runs.figures import acceptance as acceptance_figures

    check([
        range_problem("--num-spec-tokens", num_spec_tokens, 1),
        range_problem("--min-verify-steps", min_verify_steps, 1),
        None if method is None or method.strip() else
        "command line: --method: expected a method name, got ''",
        None if category is None or re.fullmatch(CATEGORY_PATTERN, category) else
        f"command line: --category: expected lower-case letters, digits, '_' and '-', got "
        f"{category!r}",
    ])  # fmt: skip
    run, records = _natural_run(run_dir)
    acceptance = acceptance_figures(records)
    _has_steps(run_dir, acceptance)
    served = _served_by(run, method, num_spec_tokens, hardware)
    check([m._writable(output)])  # after the run's refusals: a refused run leaves nothing
    settings = run.settings
    counts = m.prompt_counts(records)
    rows: dict[str, dict[str, Any]] = acceptance["al_by_category"]
    if category is not None:  # every request in one profile: the run's pooled AL and spread
        rows = {category: {"al": acceptance["token_weighted_al"],
                           "verify_steps": acceptance["verify_steps"],
                           "draft_coverage": acceptance["draft_coverage"],
                           "per_request": acceptance["per_request"]}}  # fmt: skip
        counts = {category: sum(counts.values())}
    dataset_path = settings.get("dataset_path")
    dataset = (
        Path(dataset_path).name if isinstance(dataset_path, str) and dataset_path
        else str(settings.get("dataset") or "the run's prompts")
    )  # fmt: skip
    url = settings.get("url") or "an unrecorded URL"
    model = str(settings["model"])
    base = m.provenance(served, str(url), model, dataset, source, settings.get("endpoint"),
                         settings.get("max_tokens"), float(settings["temperature"]))  # fmt: skip
    run_name = run_dir.resolve().name
    base["run"] = run_name
    plan = m.SetPlan(rows, counts, base, catalog_model or model, served, thinking.value,
                     min_verify_steps, run_name)  # fmt: skip
    head = m.measured_on(sum(counts.values()), dataset, settings.get("max_tokens"),
                         float(settings["temperature"]))  # fmt: skip
    m.write_set(plan, output, name, head, "profiles from-run")


def _natural_run(run_dir: Path) -> tuple[Run, list[RequestRecord]]:
    """The run, read through the run readers (every field typed, every size bounded), and its
    completed requests; refused (one line naming the file and field, exit 2) when it cannot
    give a measured profile: aggregate-only, forced, or over its failure limit (exit 3)."""
    from speclens.runs.request import RequestRecord
    from speclens.runs.rundir import InputError, fields, is_number, read_run

    try:
        run = read_run(run_dir, fields(_ROW_FIELDS), fields(_SUMMARY_FIELDS))
    except InputError as exc:
        fail(exc.lines, code=exc.code)
    summary = run_dir / "summary.json"
    if run.aggregate_only:
        fail(f"{summary}: aggregate_only: published figures, no per-request records: a measured "
             "profile needs a bench run's records.jsonl", code=2)  # fmt: skip
    server = run.summary.get("server")
    block = server.get("acceptance") if isinstance(server, dict) else None
    said = block.get("forced") if isinstance(block, dict) else None
    if said is True:
        al = "" if run.forced_al is None else f" {run.forced_al:g}"
        fail(f"{summary}: server.acceptance.forced: the server forced AL{al}: a measured "
             "profile needs natural acceptance", code=2)  # fmt: skip
    if said is not False and isinstance(run.summary.get("verdict"), dict):
        fail(f"{summary}: verdict: bench judged the run against an expected AL and its server "
             "does not say it served natural acceptance: a measured profile needs natural "
             "acceptance", code=2)  # fmt: skip
    failures = run.summary.get("failures")
    if isinstance(failures, dict) and failures.get("exceeded") is True:
        failed, sent = failures.get("failed"), failures.get("sent")
        rate = failures.get("max_rate")
        allowed = f" (max {rate * 100:g}%)" if is_number(rate) else ""
        fail(f"{summary}: failures.exceeded: {failed} of {sent} requests failed{allowed}: no "
             "profile set is written from such a run", code=3)  # fmt: skip
    records = [
        RequestRecord(
            index=int(row["index"]), category=str(row["category"]), end=0.0,
            completion_tokens=row.get("completion_tokens"),
            spec=row.get("spec_decode_acceptance"),
            spec_choices=_choices(row.get("spec_decode_choices")),
            spec_status=str(row.get("spec_decode_status")),
            spec_adapter=row.get("spec_decode_adapter"),
        )
        for row in run.completed
    ]  # fmt: skip
    return run, records


def _choices(raw: object) -> dict[int, dict[str, Any]] | None:
    """Per-choice records as written (checked by the row reader), keyed by choice index."""
    if not isinstance(raw, dict):
        return None
    return {int(i): dict(spec) for i, spec in raw.items()}


def _has_steps(run_dir: Path, acceptance: dict[str, Any]) -> None:
    """Refuse a run whose completed requests carried no per-request stats, or counts only (no
    verify steps, so no AL per request): one line naming records.jsonl and the field, exit 2."""
    records = run_dir / "records.jsonl"
    if not acceptance["requests_with_stats"]:
        fail(f"{records}: spec_decode_acceptance: no completed request carried per-request "
             "speculative-decoding stats: bench a server that reports them", code=2)  # fmt: skip
    if not acceptance["verify_steps"] and acceptance["counts_only_requests"]:
        engines = ", ".join(acceptance["counts_only_engines"])
        fail(f"{records}: spec_decode_acceptance.num_spec_steps: every request carried counts "
             f"only ({engines}): no verify steps, so no AL per request", code=2)  # fmt: skip


def _served_by(
    run: Run, method: str | None, num_spec_tokens: int | None, hardware: str | None
) -> Served:
    """The run's server as ``measure`` describes one (engine, method, K, chip), each agreed
    with its option; a fact neither states is asked for (exit 2)."""
    from speclens.bench.server import served_speculation
    from speclens.cli import measure as m

    info = run.summary.get("server") if isinstance(run.summary.get("server"), dict) else {}
    assert isinstance(info, dict)
    served = served_speculation(info)
    named = run.summary.get("engine")
    engine = named if isinstance(named, str) and named else m._engine(info, None)
    ks = run.ks()
    if len(ks) > 1:
        fail(f"{run.path / 'records.jsonl'}: spec_decode_acceptance.num_spec_tokens: the "
             f"requests report K {', '.join(map(str, sorted(ks)))}: a profile is at one K",
             code=2)  # fmt: skip
    k = m._agreed("--num-spec-tokens", num_spec_tokens, next(iter(ks), None))
    spec_method = m._agreed("--method", method, served.get("method"))
    if not spec_method or not k:
        fail(f"{run.path / 'summary.json'}: server.acceptance: the run's server ({engine}) "
             "states no speculative method or K: give --method and --num-spec-tokens", code=2)  # fmt: skip
    chip = hardware or info.get("hardware")
    if not isinstance(chip, str) or not chip:
        fail(f"{run.path / 'summary.json'}: server.hardware: not stated: give --hardware", code=2)
    return m.Served(info, engine, str(spec_method), int(k), chip)
