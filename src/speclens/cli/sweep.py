"""``speclens sweep``: a grid of bench runs, each an ordinary run directory under
``DIR/points/<id>``, with ``sweep.json`` and ``sweep.csv`` beside them (``speclens.runs.sweep``).

Every ``speclens bench`` option is a sweep option too: the command's parameters are bench's own
(read from its signature), with ``--concurrency`` and ``--request-rate`` taking lists. Each point
is bench's run, called in this process, so a point's files are exactly bench's.

Exit codes follow bench's; the sweep exits with its worst point's code, from the worst down:
130 interrupted (Ctrl-C, or SIGTERM, SIGHUP or another terminating signal, which acts as one:
every finished point is kept and every server stopped), 2 usage, 3 a run failed (too many failed
requests, or its server did not start or died), 1 a failed verdict, 4 inconclusive, 0 ok. A
failed point does not stop the sweep; an interrupted one does.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import typer

from speclens.cli import bench as bench_cli
from speclens.cli._common import err_console, fail, load_registry, out_console
from speclens.runs.sweep import EXIT_RUN_FAILED, Sweep, exit_code
from speclens.runs.sweep_file import Engine, load_sweep_file, placeholders, split_command
from speclens.runs.sweep_points import (
    Point,
    ServerSetting,
    load_values,
    point_id,
    points_for,
    points_problem,
)
from speclens.runs.sweep_server import Server, copy_log, free_port, interrupts, started

MAX_ROUNDS = 100
#: bench's parameters that the sweep replaces (lists, a required directory) or does not take.
_REPLACED = ("ctx", "concurrency", "request_rate", "output_dir")


def _list_problem(flag: str, text: str | None, kind: type) -> tuple[str | None, list[Any]]:
    """``1,4,16`` as numbers of ``kind``, each >= 1 (integers) or > 0 (rates)."""
    if text is None:
        return None, []
    what = "integers >= 1" if kind is int else "numbers > 0"
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        values = []
    ok = values and all(math.isfinite(v) and (v >= 1 if kind is int else v > 0) for v in values)
    if not ok or len(set(values)) < len(values):
        return f"command line: {flag}: expected distinct {what} separated by commas, got {text!r}", []  # fmt: skip
    return None, values


def _own_options() -> list[inspect.Parameter]:
    """The options bench does not have, or has with another meaning."""
    options = {
        "output_dir": (
            Path,
            typer.Option(
                ...,
                "--output-dir",
                help="The sweep directory: sweep.json, sweep.csv, points/<id>/.",
            ),
        ),
        "concurrency": (
            str | None,
            typer.Option(None, "--concurrency", help="Closed-loop load axis, e.g. 1,4,16."),
        ),
        "request_rate": (
            str | None,
            typer.Option(
                None, "--request-rate", help="Open-loop load axis in requests/s, e.g. 2,8."
            ),
        ),
        "rounds": (
            int,
            typer.Option(
                1,
                "--rounds",
                help=f"Runs per point, in [1, {MAX_ROUNDS}]: two or more give Student t intervals.",
            ),
        ),
        "sweep_file": (
            Path | None,
            typer.Option(
                None,
                "--sweep-file",
                help="Server axes: a YAML file naming each engine's server command template and axes.",
            ),
        ),
        "write_profile": (
            Path | None,
            typer.Option(
                None,
                "--write-profile",
                help="Write the sweep's natural AL at each K as a measured profile set (needs --sweep-file over K).",
            ),
        ),
    }
    return [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
        for name, (kind, default) in options.items()
    ]


def _parameters() -> list[inspect.Parameter]:
    theirs = inspect.signature(bench_cli.bench, eval_str=True).parameters.values()
    kept = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in theirs if p.name not in _REPLACED
    ]
    return _own_options() + kept


def sweep(**flags: Any) -> None:
    """Run a grid of benchmarks (load axes, or server axes from --sweep-file) with rounds."""
    run_sweep(flags)


setattr(sweep, "__signature__", inspect.Signature(_parameters()))  # noqa: B010
sweep.__annotations__ = {p.name: p.annotation for p in _parameters()}


def run_sweep(flags: dict[str, Any]) -> None:
    root: Path = flags.pop("output_dir")
    rounds: int = flags.pop("rounds")
    sweep_file: Path | None = flags.pop("sweep_file")
    write_profile: Path | None = flags.pop("write_profile")
    c_problem, concurrency = _list_problem("--concurrency", flags.pop("concurrency"), int)
    r_problem, rates = _list_problem("--request-rate", flags.pop("request_rate"), float)
    bench_cli.check([c_problem, r_problem,
                     bench_cli.range_problem("--rounds", rounds, 1, high=MAX_ROUNDS)])  # fmt: skip
    options = bench_cli.BenchOptions(
        **flags, concurrency=concurrency[0] if concurrency else None,
        request_rate=rates[0] if rates else None, output_dir=root,
    ).checked()  # fmt: skip
    bench_cli.check([_share_problem(options, concurrency, "command line: --concurrency")])
    slos = _slos(options.slo)
    engines = _engines(sweep_file) if sweep_file is not None else None
    bench_cli.check([points_problem(engines, concurrency, rates, rounds)])
    for engine in engines or []:
        values = engine.axes.concurrency or []
        bench_cli.check([_share_problem(options, values, engine.axis_field("concurrency"))])
    _check_profile_target(write_profile, engines, options)
    prompts = options.prompts()
    with interrupts() as signals:
        if engines is None:
            loads = load_values(concurrency, rates)
            runner = Runner(root, options, slos, prompts, "load", rounds, _axes(loads))
            runner.load_points(loads)
        else:
            runner = Runner(root, options, slos, prompts, "server", rounds, {})
            runner.server_points(engines, concurrency, rates)
        if signals:
            err_console.print(f"sweep: {signals[0]} received: stopped as on Ctrl-C", markup=False)  # fmt: skip
        codes = [runner.finish()]
        if write_profile is not None and not runner.interrupted:
            codes.append(write_curve(runner.state, (engines or [])[0], options, prompts, write_profile))  # fmt: skip
    code = exit_code(codes)
    if code:
        raise typer.Exit(code)


def _share_problem(options: bench_cli.BenchOptions, values: list[int], where: str) -> str | None:
    """Each worker (and shard) runs its share of the concurrency: a share of 0 would mean no
    limit at all, so every value on the axis must be at least the workers times the shards."""
    shards = options.part[1]
    parts = shards * options.workers
    low = [c for c in values if c < parts]
    if not low:
        return None
    split = f"--workers {options.workers}" + (f" x {shards} shards" if shards > 1 else "")
    return (f"{where}: expected at least one request per worker and shard ({parts}: {split}), "
            f"got {', '.join(map(str, low))}")  # fmt: skip


def _slos(text: str | None) -> dict[str, float]:
    from speclens.runs.figures import parse_slo

    try:
        return parse_slo(text)
    except ValueError as exc:
        fail(str(exc), code=2)


def _engines(path: Path) -> list[Engine]:
    from speclens.acceptance import ValidationError

    try:
        return load_sweep_file(path)
    except ValidationError as exc:
        fail([str(p) for p in exc.problems], code=2)


def _check_profile_target(
    path: Path | None, engines: list[Engine] | None, options: bench_cli.BenchOptions
) -> None:
    """--write-profile needs one engine swept over K with natural acceptance, and a path."""
    if path is None:
        return
    from speclens.cli.measure import _writable

    flag = "command line: --write-profile"
    if engines is None or len(engines) != 1:
        fail(f"{flag}: expected --sweep-file with one engine (the curve is one engine's)", code=2)
    axes = engines[0].axes
    if not axes.num_speculative_tokens:
        fail(f"{flag}: expected a num_speculative_tokens axis in the sweep file", code=2)
    if axes.acceptance_length is not None or axes.acceptance_profile is not None:
        fail(f"{flag}: expected natural acceptance (no acceptance_length or acceptance_profile axis)", code=2)  # fmt: skip
    if options.thinking not in (None, "on", "off"):
        fail(f"command line: --thinking: expected on or off, got {options.thinking!r}", code=2)
    bench_cli.check([_writable(path)])


def _axes(loads: list[tuple[str, float | None]]) -> dict[str, list[Any]]:
    values = [v for _, v in loads if v is not None]
    return {loads[0][0]: values} if values else {}


class Runner:
    """Runs the points in order, recording each as it ends; Ctrl-C ends the sweep there."""

    def __init__(
        self, root: Path, options: bench_cli.BenchOptions, slos: dict[str, float],
        prompts: list[Any], kind: Any, rounds: int, axes: dict[str, list[Any]],
    ) -> None:  # fmt: skip
        self.options, self.slos, self.prompts = options, slos, prompts
        self.state = Sweep(root, kind, rounds, axes, seed=options.seed)
        self.interrupted = False
        self._writable(root)

    @staticmethod
    def _writable(root: Path) -> None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / "points").mkdir(exist_ok=True)
        except OSError as exc:
            fail(f"command line: --output-dir: cannot write to {str(root)!r}: {exc.strerror or exc}", code=2)  # fmt: skip

    def load_points(self, loads: list[tuple[str, float | None]]) -> None:
        points = points_for(ServerSetting(None), loads, self.state.rounds)
        self.state.points = points
        self.state.write()
        for point in points:
            if self.interrupted:
                return
            self.run_point(point, self.options)

    def run_point(self, point: Point, base: bench_cli.BenchOptions) -> None:
        """One bench run in ``point.dir``, recorded; a Ctrl-C anywhere in it stops the sweep."""
        settings = point.settings
        options = replace(base, concurrency=settings["concurrency"],
                          request_rate=settings["request_rate"],
                          output_dir=self.state.root / point.dir)  # fmt: skip
        err_console.print(f"sweep: point {point.id}", markup=False, highlight=False)
        try:
            code = _bench_point(options, self.slos, self.prompts)
        except KeyboardInterrupt:
            code = 130
        self.interrupted = code == 130
        self.state.record(point, code, _reason(self.state.root / point.dir, code))

    def fail_points(self, points: list[Point], reason: str) -> None:
        for point in points:
            if point.status == "pending":
                self.state.record(point, EXIT_RUN_FAILED, reason)

    def server_points(
        self, engines: list[Engine], concurrency: list[int], rates: list[float]
    ) -> None:
        plan = [(engine, setting, points_for(setting, loads, self.state.rounds))
                for engine in engines
                for setting, loads in _settings(engine, concurrency, rates, self.options)]  # fmt: skip
        for engine, setting, _ in plan:  # a forcing line the engine cannot express: usage
            try:
                _command(engine, setting, 0, self.options)
            except _Refused as exc:
                fail(str(exc), code=2)
        self.state.points = [p for _, _, points in plan for p in points]
        self.state.axes = _server_axes(plan)
        self.state.write()
        for engine, setting, points in plan:
            if self.interrupted:
                return
            self._serve(engine, setting, points)

    def _serve(self, engine: Engine, setting: ServerSetting, points: list[Point]) -> None:
        """Start the setting's server, run its points, stop it; its log goes to each point."""
        port = free_port()
        try:
            env, argv = split_command(_command(engine, setting, port, self.options))
        except _Refused as exc:
            self.fail_points(points, str(exc))
            return
        log = self.state.root / "servers" / f"{_setting_id(setting)}.log"
        server = Server(argv, env, log, f"http://127.0.0.1:{port}{engine.spec.health}",
                           engine.spec.startup_timeout_s)  # fmt: skip
        err_console.print(f"sweep: starting {engine.spec.name} for {_setting_id(setting)}", markup=False)  # fmt: skip
        base = replace(self.options, url=[f"http://127.0.0.1:{port}"],
                       model=engine.spec.model or self.options.model)  # fmt: skip
        try:
            with started(server) as why:
                self._run_served(server, why, base, points)
        except KeyboardInterrupt:
            self.interrupted = True
            self._interrupt(points)
        finally:
            for point in points:
                _copy_log(log, self.state.root / point.dir / "server.log")

    def _run_served(
        self, server: Server, why: str | None, base: bench_cli.BenchOptions,
        points: list[Point],
    ) -> None:  # fmt: skip
        if why is not None:
            self.fail_points(points, why)
            return
        for point in points:
            if self.interrupted:
                break
            self.run_point(point, base)
            died = server.died()
            if died:
                if point.status == "ok":  # its server is gone: nothing says the run was sound
                    self.state.record(point, EXIT_RUN_FAILED, died)
                self.fail_points(points, died)
                return

    def _interrupt(self, points: list[Point]) -> None:
        pending = [p for p in points if p.status == "pending"]
        if pending:
            self.state.record(pending[0], 130, "interrupted")

    def finish(self) -> int:
        """Write the files, print one line per point; the worst point's exit code."""
        paths = self.state.write()
        _html(self.state.root)
        for point in self.state.points:
            figures = point.figures or {}
            tput = figures.get("output_tokens_per_s")
            al = figures.get("realized_al")
            shown = f"{tput.mean:,.1f} tok/s" if tput and math.isfinite(tput.mean) else "-"
            al_text = f"AL {al.mean:.4f}" if al and math.isfinite(al.mean) else "AL -"
            out_console.print(f"{point.id}: {point.status} ({shown}, {al_text})", markup=False)
        for path in paths:
            out_console.print(f"wrote {path}", markup=False)
        pending = [p for p in self.state.points if p.status == "pending"]
        if self.interrupted:
            err_console.print(f"sweep: interrupted; {len(pending)} points not run; finished points are in {self.state.root}", markup=False)  # fmt: skip
        return exit_code([p.exit_code for p in self.state.points])


def _html(root: Path) -> None:
    from speclens.runs.html_sweep import write_sweep_report

    try:
        out_console.print(f"wrote {write_sweep_report(root)}", markup=False)
    except OSError as exc:
        err_console.print(f"sweep: report.html not written: {exc}", markup=False)


def _bench_point(options: bench_cli.BenchOptions, slos: dict[str, float], prompts: list[Any]) -> int:  # fmt: skip
    """bench's run and report for one point, in this process; its exit code."""
    try:
        expectation = options.expectation()
        chosen, evidence = bench_cli.resolve_backend(
            options.backend, options.endpoint, options.url, options.api_key
        )
        config = options.load_config(chosen)
        outcome, records = bench_cli.run(
            options, config, prompts, expectation, slos, options.settings(config, evidence)
        )
        bench_cli.report(outcome, records)
    except typer.Exit as exc:
        return int(exc.exit_code)
    return 0


def _reason(run_dir: Path, code: int) -> str | None:
    """Why a point failed, from its summary.json (its own output has scrolled by)."""
    if code == 0:
        return None
    if code == 130:
        return "interrupted"
    try:
        summary = orjson.loads((run_dir / "summary.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return f"bench exited with code {code} before writing summary.json"
    fails = summary.get("failures") or {}
    verdict = summary.get("verdict") or {}
    if code == 3:
        first = "; ".join(
            f"{r['error']} (x{r['count']})" for r in fails.get("first_errors", [])[:3]
        )
        return f"{fails.get('failed')} of {fails.get('sent')} requests failed: {first}"
    if code == 1 and verdict:
        return f"verification FAIL: {verdict.get('reason')}"
    return f"bench exited with code {code}"


class _Refused(Exception):
    """A setting whose forcing line cannot be made (the engine cannot express it)."""


def _settings(
    engine: Engine, concurrency: list[int], rates: list[float], options: bench_cli.BenchOptions
) -> list[tuple[ServerSetting, list[tuple[str, float | None]]]]:
    """The engine's server settings (K x AL) and the load axis each runs; exit 2 for an AL
    above K + 1 or a load axis given both in the file and on the command line."""
    axes, name = engine.axes, engine.spec.name
    if (axes.concurrency or axes.request_rate) and (concurrency or rates):
        fail(f"{engine.where}: the load axis is in the sweep file and on the command line; give one", code=2)  # fmt: skip
    loads = load_values(axes.concurrency or concurrency, axes.request_rate or rates)
    out = []
    ks: list[int | None] = (
        [None] if not axes.num_speculative_tokens else [*axes.num_speculative_tokens]
    )
    for k in ks:
        als: list[float | None] = (
            [None] if not axes.acceptance_length else [*axes.acceptance_length]
        )
        if axes.acceptance_profile is not None and k is not None:
            als = [_profile_al(engine, k, options)]
        for al in als:
            if al is not None and k is not None and al > k + 1:
                fail(f"{engine.where}: axes.acceptance_length: {al:g} is above K + 1 = {k + 1} at K {k}", code=2)  # fmt: skip
            out.append((ServerSetting(name, k, al), loads))
    return out


def _profile_al(engine: Engine, k: int, options: bench_cli.BenchOptions) -> float:
    return float(_resolution(engine, k, None, options).acceptance_length)


def _resolution(engine: Engine, k: int, al: float | None, options: bench_cli.BenchOptions) -> Any:  # fmt: skip
    """The acceptance the point forces: its AL (the command line layer) or the profile's."""
    from speclens.acceptance import ResolutionRefused, ValidationError, WorkloadAcceptance, resolve
    from speclens.cli._common import cli_value

    query = engine.axes.acceptance_profile
    try:
        if query is not None:
            workload = WorkloadAcceptance.model_validate({"thinking": query.thinking, "category": query.category})  # fmt: skip
            return resolve(model=query.model, method=query.method, num_spec_tokens=k,
                           registry=load_registry(options.registry), workload=workload)  # fmt: skip
        return resolve(model=str(engine.spec.model or options.model),
                       method=str(engine.spec.method or "unknown"), num_spec_tokens=k,
                       registry=load_registry(options.registry), cli=cli_value(k, al, None, None))  # fmt: skip
    except ValidationError as exc:
        fail([f"{engine.where}: {p}" for p in exc.problems], code=2)
    except ResolutionRefused as exc:
        fail(f"{engine.where}: acceptance_profile at K {k}: refused: {exc}", code=2)


def _command(
    engine: Engine, setting: ServerSetting, port: int, options: bench_cli.BenchOptions
) -> str:
    """The command template filled for this setting; {forcing} is what
    ``speclens profiles resolve --emit ENGINE`` prints for it."""
    spec = engine.spec
    forcing = ""
    if "forcing" in placeholders(spec.command) and setting.k is not None:
        from speclens.acceptance.emit import EmitRefused, emit

        res = _resolution(engine, setting.k, setting.al, options)
        try:
            forcing = emit(res, str(spec.emit), str(spec.method)).line
        except EmitRefused as exc:
            raise _Refused(f"{engine.where}: {{forcing}} at K {setting.k}: {exc}") from None
    values = {"port": port, "k": setting.k, "al": "" if setting.al is None else repr(setting.al),
              "forcing": forcing}  # fmt: skip
    return spec.command.format(**values)


def _setting_id(setting: ServerSetting) -> str:
    return point_id(setting, ("concurrency", None), 0).removesuffix("-r0")


def _server_axes(plan: list[tuple[Engine, ServerSetting, list[Point]]]) -> dict[str, list[Any]]:  # fmt: skip
    """The axes the plan varies, each value once in first-seen order."""
    axes: dict[str, list[Any]] = {}

    def add(name: str, value: Any) -> None:
        if value is not None and value not in axes.setdefault(name, []):
            axes[name].append(value)

    for _, setting, points in plan:
        add("engine", setting.engine)
        add("num_speculative_tokens", setting.k)
        add("acceptance_length", setting.al)
        for p in points:
            add("concurrency", p.settings["concurrency"])
            add("request_rate", p.settings["request_rate"])
    return {k: v for k, v in axes.items() if v}


def _copy_log(log: Path, target: Path) -> None:
    if not log.is_file() or log.is_symlink():
        return
    try:
        copy_log(log, target)
    except OSError as exc:
        err_console.print(f"sweep: {target}: cannot copy the server log: {exc.strerror or exc}", markup=False)  # fmt: skip


# ------------------------------------------------------------------------- the golden curve
def _curve_counts(state: Sweep) -> dict[tuple[int, str], list[int]]:
    """(K, category) -> [accepted drafts, verify steps] pooled over every finished point."""
    pooled: dict[tuple[int, str], list[int]] = {}
    for point in state.points:
        k = point.settings["num_speculative_tokens"]
        if point.status != "ok" or k is None:
            continue
        for row in _rows(state.root / point.dir / "records.jsonl"):
            spec = row.get("spec_decode_acceptance")
            if row.get("warmup") or not row.get("success") or not isinstance(spec, dict):
                continue
            steps, accepted = spec.get("num_spec_steps"), spec.get("num_accepted_draft_tokens")
            if type(steps) is int and type(accepted) is int and steps > 0:
                cell = pooled.setdefault((k, str(row.get("category"))), [0, 0])
                cell[0] += accepted
                cell[1] += steps
    return pooled


def _rows(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _served(state: Sweep) -> dict[str, Any]:
    """The server's /version as the first finished point's summary.json recorded it."""
    for point in state.points:
        if point.status != "ok":
            continue
        try:
            server = orjson.loads((state.root / point.dir / "summary.json").read_bytes()).get(
                "server"
            )
        except (OSError, orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(server, dict):
            return server
    return {}


def write_curve(
    state: Sweep, engine: Engine, options: bench_cli.BenchOptions, prompts: list[Any],
    output: Path,
) -> int:  # fmt: skip
    """The sweep's natural AL at each K (and category) as a measured profile set, written by
    ``measure``'s writer; its exit code: 4 (nothing written) when no K has a verify step, 2
    when the profile's method or hardware is not known."""
    from speclens.acceptance import acceptance_length
    from speclens.cli.measure import INCONCLUSIVE, _write

    pooled = _curve_counts(state)
    if not pooled:
        err_console.print(f"sweep: inconclusive: no K has a verify step: no profile set written to {output}", markup=False)  # fmt: skip
        return INCONCLUSIVE
    served = _served(state)
    acceptance = served.get("acceptance")
    block: dict[str, Any] = acceptance if isinstance(acceptance, dict) else {}
    method = engine.spec.method or block.get("method")
    hardware = engine.spec.hardware or served.get("hardware")
    for what, value, key in (("method", method, "method"), ("hardware", hardware, "hardware")):
        if not value:
            err_console.print(f"{engine.where}: {key}: expected the engine's {what} (its server does not report it): no profile set written to {output}", markup=False)  # fmt: skip
            return 2
    sent = prompts[: options.count] if options.count else prompts
    base = _curve_provenance(state, engine, options, served, str(hardware), len(sent))
    profiles = []
    for (k, category), (accepted, steps) in sorted(pooled.items()):
        profiles.append({
            "model": str(options.model), "speculative_method": str(method), "num_spec_tokens": k,
            "thinking": options.thinking or "off", "category": category,
            "acceptance_length": round(acceptance_length(accepted, steps), 4),
            "method": "measured",
            "provenance": {**copy.deepcopy(base),
                           "prompts": sum(1 for p in sent if p.category == category)},
        })  # fmt: skip
    document = {
        "kind": "AcceptanceProfileSet",
        "name": output.stem,
        "caveats": [
            f"Measured with natural acceptance by a sweep over K ({state.root}), "
            f"{options.max_tokens} output tokens at temperature {options.temperature:g}.",
            "Verify steps per K and category: "
            + ", ".join(f"K {k} {c} {n}" for (k, c), (_, n) in sorted(pooled.items()))
            + ".",
        ],
        "profiles": profiles,
    }
    _write(document, output)
    out_console.print(f"wrote {output} ({len(profiles)} measured profiles)", markup=False)
    return 0


def _curve_provenance(
    state: Sweep, engine: Engine, options: bench_cli.BenchOptions, served: dict[str, Any],
    hardware: str, prompts: int,
) -> dict[str, Any]:  # fmt: skip
    name = str(served.get("engine") or engine.spec.name)
    version = served.get("version")
    benchmark = options.dataset_path.name if options.dataset_path else options.dataset
    loads = {k: v for k, v in state.axes.items() if k in ("concurrency", "request_rate")}
    return {
        "source": f"speclens sweep over K of {name} {version or ''}".rstrip(),
        "run": str(state.root),
        "benchmark": benchmark,
        "prompts": prompts,
        "hardware": hardware,
        "engine_image": f"{name}=={version}" if version else name,
        "sampling": {"temperature": options.temperature, "max_tokens": options.max_tokens},
        "settings": {
            "rejection_sample_method": "greedy" if options.temperature == 0 else "probabilistic",
            "endpoint": options.endpoint.value, "model": str(options.model),
            "ignore_eos": options.ignore_eos, "rounds": state.rounds,
            **{axis: values for axis, values in loads.items() if values},
        },
    }  # fmt: skip
