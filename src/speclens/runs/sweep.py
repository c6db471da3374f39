"""A sweep: a grid of runs, each an ordinary run directory under ``DIR/points/<id>``, with
``DIR/sweep.json`` (schema ``speclens.sweep/1``) and ``DIR/sweep.csv`` rewritten after every
point, so an interrupted sweep keeps every point it finished.

Load axes (concurrency, request rate) sweep one running server. Server axes come from a sweep
file (YAML): per engine a server command template whose placeholders ({port}, {k}, {al},
{forcing}) are filled for each setting; the server is started in its own process group, waited
on by its health route (bounded), and stopped by its group (SIGTERM, then SIGKILL), its log kept
beside the point's run. A terminating signal to the sweep acts as a Ctrl-C (``interrupts``), and
nothing interrupts a server's stop (``held``), so no server outlives the sweep. This module never imports bench, sim, engine or server: the caller
passes the function that runs one point.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import itertools
import math
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import string
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from speclens.acceptance import Problem, ValidationError
from speclens.acceptance.files import key_mark, read_yaml, validate
from speclens.acceptance.quantity import num_spec_tokens_problem
from speclens.runs.files import open_new
from speclens.runs.points import FIGURES, PointError, RoundSummary, combine, summarize
from speclens.runs.stats import Interval

SCHEMA = "speclens.sweep/1"
PLACEHOLDERS = ("port", "k", "al", "forcing")
#: Engines whose forcing line ``{forcing}`` can be (``speclens profiles resolve --emit``).
EMIT_ENGINES = ("vllm", "atom", "sglang", "trtllm")
#: Exit codes from the worst down: a sweep exits with its worst point's (``exit_code``).
SEVERITY = (130, 2, 3, 1, 4, 0)
EXIT_RUN_FAILED = 3  # a point whose server did not start or died
LOG_TAIL_LINES = 20
LOG_TAIL_CHARS = 2000
STOP_GRACE_S = 10.0
MAX_STARTUP_S = 3600.0
MAX_POINTS = 10_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# ------------------------------------------------------------------------ the sweep file
def _k_item(k: int) -> int:
    problem = num_spec_tokens_problem(k)
    if problem:
        raise ValueError(f"K {problem}")
    return k


def _unique(values: list[Any]) -> list[Any]:
    if not values:
        raise ValueError("expected at least one value")
    if len(set(values)) < len(values):
        raise ValueError("a value is given twice")
    return values


def _positive(value: float) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"expected a finite number > 0, got {value!r}")
    return value


def _al_item(value: float) -> float:
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"expected an acceptance length >= 1, got {value!r}")
    return value


def _concurrency_item(value: int) -> int:
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {value}")
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ProfileQuery(_Model):
    """The registry profile whose AL each K replays (``speclens profiles resolve``'s query)."""

    model: str = Field(min_length=1)
    method: str = Field(min_length=1)
    thinking: Literal["on", "off"] | None = None
    category: str | None = None


class Axes(_Model):
    """What a sweep varies; absent axes are not varied."""

    num_speculative_tokens: (
        Annotated[list[Annotated[int, AfterValidator(_k_item)]], AfterValidator(_unique)] | None
    ) = None
    acceptance_length: (
        Annotated[list[Annotated[float, AfterValidator(_al_item)]], AfterValidator(_unique)] | None
    ) = None
    acceptance_profile: ProfileQuery | None = None
    concurrency: (
        Annotated[list[Annotated[int, AfterValidator(_concurrency_item)]], AfterValidator(_unique)]
        | None
    ) = None
    request_rate: (
        Annotated[list[Annotated[float, AfterValidator(_positive)]], AfterValidator(_unique)] | None
    ) = None


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"expected a name of letters, digits, '.', '_' or '-' (at most 64), got {value[:80]!r}"
        )
    return value


def _route(value: str) -> str:
    if not value.startswith("/") or any(c.isspace() for c in value):
        raise ValueError(f"expected a path such as /health, got {value[:80]!r}")
    return value


def _startup(value: float) -> float:
    if not math.isfinite(value) or not 0 < value <= MAX_STARTUP_S:
        raise ValueError(f"expected seconds in (0, {MAX_STARTUP_S:g}], got {value!r}")
    return value


class EngineSpec(_Model):
    """One engine: how to start its server for a setting, and how to know it is up."""

    name: Annotated[str, AfterValidator(_name)]
    command: str = Field(min_length=1, max_length=8192)
    health: Annotated[str, AfterValidator(_route)] = "/health"
    emit: Literal["vllm", "atom", "sglang", "trtllm"] | None = None
    method: str | None = Field(None, min_length=1)
    model: str | None = Field(None, min_length=1)
    hardware: str | None = Field(None, min_length=1)
    startup_timeout_s: Annotated[float, AfterValidator(_startup)] = 600.0
    axes: Axes | None = None


class SweepFile(_Model):
    engines: list[EngineSpec] = Field(min_length=1)
    axes: Axes | None = None


@dataclass(frozen=True)
class Engine:
    """An engine of a checked sweep file, its axes merged over the file's."""

    spec: EngineSpec
    axes: Axes
    where: str  # "<file>: engines[i].command (line N)"
    file: str = ""
    index: int = 0

    def axis_field(self, axis: str) -> str:
        """``<file>: <where the axis is set>``: the engine's own axes, else the file's."""
        own = self.spec.axes is not None and getattr(self.spec.axes, axis) is not None
        return f"{self.file}: " + (f"engines[{self.index}].axes.{axis}" if own else f"axes.{axis}")


def _merged(file_axes: Axes | None, own: Axes | None) -> Axes:
    base = file_axes.model_dump() if file_axes else {}
    base.update({k: v for k, v in (own.model_dump() if own else {}).items() if v is not None})
    return Axes.model_validate(base)


def load_sweep_file(path: Path) -> list[Engine]:
    """The sweep file's engines, every problem raised at once as a ValidationError (each line
    ``<file>: <field>: <what was expected>``): the schema, the placeholders, the axes each
    placeholder needs, a program that is not found."""
    data = read_yaml(path)
    parsed = validate(SweepFile, data, str(path))
    engines, problems = [], []
    names = [e.name for e in parsed.engines]
    for i, spec in enumerate(parsed.engines):
        raw = data["engines"][i]
        mark = key_mark(raw, "command")
        where = f"engines[{i}].command" + (f" (line {mark.line})" if mark else "")
        engine = Engine(spec, _merged(parsed.axes, spec.axes), f"{path}: {where}", str(path), i)
        problems += [Problem(str(path), where, m) for m in command_problems(engine)]
        if names.count(spec.name) > 1:
            problems.append(Problem(str(path), f"engines[{i}].name", "a name is given twice"))
        engines.append(engine)
    if problems:
        raise ValidationError(problems)
    return engines


def placeholders(template: str) -> list[str]:
    """The placeholder names of ``template``; ValueError for unbalanced braces."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        names.append(name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else ""))
    return names


def command_problems(engine: Engine) -> list[str]:
    """What is wrong with an engine's command: an unknown placeholder, one the axes cannot fill,
    text that does not split as a command line, a program that is not found."""
    spec, axes = engine.spec, engine.axes
    try:
        names = placeholders(spec.command)
    except ValueError as exc:
        return [f"{exc}: expected placeholders {_expected()} (write {{{{ and }}}} for braces)"]
    problems = [f"unknown placeholder {{{n}}}: expected {_expected()}" for n in names if n not in PLACEHOLDERS]  # fmt: skip
    has_al = axes.acceptance_length is not None or axes.acceptance_profile is not None
    needs = {
        "k": (axes.num_speculative_tokens is not None, "a num_speculative_tokens axis"),
        "al": (has_al, "an acceptance_length axis or an acceptance_profile"),
        "forcing": (
            has_al and spec.emit is not None and spec.method is not None,
            "emit (vllm, atom, sglang or trtllm), method, and an acceptance_length axis or acceptance_profile",
        ),
    }
    for name, (ok, what) in needs.items():
        if name in names and not ok:
            problems.append(f"placeholder {{{name}}} needs {what}")
    if "port" not in names:
        problems.append("expected the placeholder {port}: every server gets its own port")
    if axes.acceptance_length is not None and axes.acceptance_profile is not None:
        problems.append("axes: give acceptance_length or acceptance_profile, not both")
    if axes.concurrency is not None and axes.request_rate is not None:
        problems.append("axes: give concurrency or request_rate, not both")
    if problems:
        return problems
    return _program_problems(spec.command)


def _expected() -> str:
    return ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)


def _program_problems(template: str) -> list[str]:
    filled = template.format(port=1, k=1, al=1, forcing="")
    try:
        _env, argv = split_command(filled)
    except ValueError as exc:
        return [f"cannot be split as a command line: {exc}"]
    if not argv:
        return ["expected a program to run, got none"]
    if program(argv[0]) is None:
        return [f"program {argv[0][:200]!r} is not found: expected a program on PATH or a path to one"]  # fmt: skip
    return []


def program(name: str) -> str | None:
    """The executable ``name`` runs, or None."""
    return shutil.which(name)


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_command(text: str) -> tuple[dict[str, str], list[str]]:
    """A command line as a shell would split it: leading ``NAME=value`` words are the
    environment (SGLang and TensorRT-LLM force acceptance through variables), then the argv."""
    words = shlex.split(text)
    env: dict[str, str] = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


# ------------------------------------------------------------------------------ the grid
@dataclass(frozen=True)
class ServerSetting:
    """One server start: an engine at K and AL (None: not on an axis)."""

    engine: str | None
    k: int | None = None
    al: float | None = None


@dataclass
class Point:
    id: str
    engine: str | None
    settings: dict[str, Any]
    round: int
    dir: str
    status: str = "pending"
    exit_code: int | None = None
    error: str | None = None
    figures: dict[str, Interval] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "engine": self.engine, "settings": self.settings,
                "round": self.round, "dir": self.dir, "status": self.status,
                "exit_code": self.exit_code, "error": self.error}  # fmt: skip


def _num(value: float) -> str:
    return f"{value:g}"


def point_id(server: ServerSetting, load: tuple[str, float | None], rnd: int) -> str:
    parts = [server.engine] if server.engine else []
    if server.k is not None:
        parts.append(f"k{server.k}")
    if server.al is not None:
        parts.append(f"al{_num(server.al)}")
    axis, value = load
    if value is not None:
        parts.append(f"c{int(value)}" if axis == "concurrency" else f"rate{_num(value)}")
    parts.append(f"r{rnd}")
    return "-".join(parts)


def load_values(
    concurrency: Sequence[int] | None, rate: Sequence[float] | None
) -> list[tuple[str, float | None]]:
    """The load axis as (name, value) pairs; neither given: one point at bench's default."""
    if rate:
        return [("request_rate", float(r)) for r in rate]
    if concurrency:
        return [("concurrency", int(c)) for c in concurrency]
    return [("concurrency", None)]


def _load_count(concurrency: Sequence[int] | None, rate: Sequence[float] | None) -> int:
    return len(rate or concurrency or [None])


def engine_points(
    engine: Engine, concurrency: Sequence[int] | None, rate: Sequence[float] | None, rounds: int
) -> tuple[int, str]:
    """How many points an engine's axes make (K x AL x load x rounds, counted, not listed),
    and the product as text."""
    axes = engine.axes
    ks = len(axes.num_speculative_tokens or [None])
    als = 1 if axes.acceptance_profile is not None else len(axes.acceptance_length or [None])
    own = axes.concurrency is not None or axes.request_rate is not None
    loads = _load_count(axes.concurrency, axes.request_rate) if own else _load_count(concurrency, rate)  # fmt: skip
    text = f"{ks} K x {als} AL x {loads} loads x {rounds} rounds"
    return ks * als * loads * rounds, text


def points_problem(
    engines: Sequence[Engine] | None, concurrency: Sequence[int] | None,
    rate: Sequence[float] | None, rounds: int,
) -> str | None:  # fmt: skip
    """One line when the sweep would run more than ``MAX_POINTS`` points, from the axes' sizes
    alone (before any point is planned): ``<file>: axes: ...`` or ``command line: ...``."""
    if not engines:
        total = _load_count(concurrency, rate) * rounds
        if total <= MAX_POINTS:
            return None
        flag = "--request-rate" if rate else "--concurrency"
        return (f"command line: {flag}: {total:,} points ({_load_count(concurrency, rate)} loads "
                f"x {rounds} rounds): expected at most {MAX_POINTS:,}")  # fmt: skip
    counts = [engine_points(e, concurrency, rate, rounds) for e in engines]
    total = sum(n for n, _ in counts)
    if total <= MAX_POINTS:
        return None
    largest = max(range(len(engines)), key=lambda i: counts[i][0])
    engine = engines[largest]
    return (f"{engine.file}: axes: {total:,} points (engines[{largest}] {engine.spec.name}: "
            f"{counts[largest][1]}): expected at most {MAX_POINTS:,}")  # fmt: skip


def points_for(
    server: ServerSetting, loads: list[tuple[str, float | None]], rounds: int
) -> list[Point]:
    out = []
    for (axis, value), rnd in itertools.product(loads, range(rounds)):
        pid = point_id(server, (axis, value), rnd)
        settings = {
            "concurrency": int(value) if axis == "concurrency" and value is not None else None,
            "request_rate": value if axis == "request_rate" else None,
            "num_speculative_tokens": server.k,
            "acceptance_length": server.al,
        }
        out.append(Point(pid, server.engine, settings, rnd, f"points/{pid}"))
    return out


# -------------------------------------------------------------------------- the servers
def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path) -> str:
    """The last lines of a server log, bounded, for a failure's reason."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror or exc})"
    lines = [line for line in text.splitlines() if line.strip()][-LOG_TAIL_LINES:]
    return "\n".join(lines)[-LOG_TAIL_CHARS:] or "(the log is empty)"


@dataclass
class Server:
    """One server process in its own process group, its output in ``log_path``."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    health_url: str
    timeout_s: float
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> str | None:
        """Start it and wait for its health route: None when it answers 200 in time, else why
        not (with its log's tail)."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open_new(self.log_path)  # a link planted there is refused, never followed
        except OSError as exc:
            return f"{self.log_path}: the server log cannot be written: {exc.strerror or exc}"
        try:
            with log, held():  # a signal between the fork and ``self.proc`` would orphan it
                self.proc = subprocess.Popen(
                    self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, **self.env}, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            return f"the server command {self.argv[0]!r} cannot start: {exc.strerror or exc}"
        return self._wait_healthy()

    def _wait_healthy(self) -> str | None:
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                return self.why(f"the server exited with code {code} before {self.health_url} answered")  # fmt: skip
            if _healthy(self.health_url):
                return None
            time.sleep(0.2)
        return self.why(f"the server was not healthy at {self.health_url} after {self.timeout_s:g} s")  # fmt: skip

    def why(self, reason: str) -> str:
        return f"{reason}; server log tail ({self.log_path.name}):\n{log_tail(self.log_path)}"

    def died(self) -> str | None:
        """Why it is gone, when it exited while it should be serving."""
        code = None if self.proc is None else self.proc.poll()
        return None if code is None else self.why(f"the server exited with code {code} during the sweep")  # fmt: skip

    def stop(self) -> None:
        """SIGTERM to its process group, then SIGKILL to what is left after the grace. Nothing
        interrupts it: a Ctrl-C or a terminating signal that arrives meanwhile is held, and
        delivered once the group is gone."""
        if self.proc is None:
            return
        with held():
            self._stop()

    def _stop(self) -> None:
        assert self.proc is not None
        group = self.proc.pid
        _signal_group(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_GRACE_S)
        deadline = time.monotonic() + (STOP_GRACE_S if self.proc.poll() is not None else 0)
        while _group_alive(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_GRACE_S)


def copy_log(log: Path, target: Path) -> None:
    """The setting's server log copied to a point's ``server.log``, never through a link planted
    at either; OSError names the file."""
    fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(log))
        target.parent.mkdir(parents=True, exist_ok=True)
        with open_new(target) as out:
            shutil.copyfileobj(source, out)


# ------------------------------------------------------------------------------ signals
def _terminating() -> tuple[signal.Signals, ...]:
    names = ("SIGHUP", "SIGTERM", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM",
             "SIGPROF", "SIGXCPU", "SIGIO", "SIGPWR")  # fmt: skip
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


#: The signals whose default action ends the process, besides SIGINT (which Python raises as
#: KeyboardInterrupt): a sweep takes each as a Ctrl-C, so that the server it started is stopped.
TERMINATING = _terminating()


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _as_ctrl_c(signum: int, _frame: Any) -> None:
    """A terminating signal handled as a Ctrl-C: through SIGINT's own handler (bench's load
    phase ends its sending on it), or as a KeyboardInterrupt where SIGINT is ignored."""
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        raise KeyboardInterrupt
    signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def interrupts() -> Iterator[list[str]]:
    """For the block, every terminating signal left at its default action (one ignored, as
    ``nohup`` ignores SIGHUP, or handled by someone else is left alone) acts as a Ctrl-C; yields
    the names of those that arrived. The handlers are put back after."""
    if not _in_main_thread():
        yield []
        return
    seen: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        seen.append(signal.Signals(signum).name)
        _as_ctrl_c(signum, frame)

    previous = {}
    for sig in TERMINATING:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield seen
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT and the terminating signals for the block (stopping a server must not be cut
    short: a second Ctrl-C during its grace period would skip the SIGKILL); the first that
    arrived is delivered to its own handler after the block."""
    if not _in_main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    for sig in (signal.SIGINT, *TERMINATING):
        handler = signal.getsignal(sig)
        if handler is not signal.SIG_IGN and handler is not None:
            previous[sig] = signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if caught:
        signal.raise_signal(caught[0])


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def started(server: Server) -> Iterator[str | None]:
    """The server started (yields why it failed, or None), always stopped after."""
    try:
        yield server.start()
    finally:
        server.stop()


# ------------------------------------------------------------------------ the sweep files
def exit_code(codes: Sequence[int | None]) -> int:
    """The worst point's code: 130 interrupted, 2 usage, 3 a run failed, 1 a failed verdict,
    4 inconclusive, 0 ok (any other code ranks with 3)."""
    seen = [c if c in SEVERITY else EXIT_RUN_FAILED for c in codes if c is not None]
    return min(seen, key=SEVERITY.index) if seen else 0


def status_of(code: int) -> str:
    return {0: "ok", 130: "interrupted"}.get(code, "failed")


@dataclass
class Sweep:
    """The sweep directory as it fills: ``record`` after each point rewrites sweep.json and
    sweep.csv (atomically: a reader never sees half a file).

    Only points that finished ok have figures, count in ``rounds_ok`` and feed ``stats``: a
    failed verdict, too many failed requests, a server that died after its point, a cut point
    leave their row in sweep.csv without figures. ``record`` reads a point's run once (one
    bootstrap for its own figures) and recomputes only its own setting's statistics, from the
    rounds' kept estimates: N points cost N reads and N bootstraps, not N(N+1)/2."""

    root: Path
    kind: Literal["load", "server"]
    rounds: int
    axes: dict[str, list[Any]]
    points: list[Point] = field(default_factory=list)
    seed: int = 0
    _summaries: dict[str, RoundSummary] = field(default_factory=dict, init=False, repr=False)
    _stats: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)

    @staticmethod
    def _key(point: Point) -> str:
        """The point's setting (engine and settings) as text: its statistics' key."""
        return orjson.dumps([point.engine, point.settings]).decode()

    def record(self, point: Point, code: int, error: str | None = None) -> None:
        """The point's outcome (again, when a point that finished ok turns out failed: its
        server died after it), its setting's statistics, and both files rewritten."""
        point.exit_code, point.status, point.error = code, status_of(code), error
        point.figures = None
        self._summaries.pop(point.id, None)
        if code == 0:
            try:
                summary = summarize(self.root / point.dir, self.seed)
            except PointError as exc:
                point.status, point.error = "failed", str(exc)
            else:
                self._summaries[point.id] = summary
                point.figures = summary.figures
        self._restat(self._key(point))
        self.write()

    def ran(self) -> list[Point]:
        """The points that ran or were cut (a point not reached is in neither file)."""
        return [p for p in self.points if p.status != "pending"]

    def _restat(self, key: str) -> None:
        members = [p for p in self.ran() if self._key(p) == key]
        if not members:
            self._stats.pop(key, None)
            return
        ok = [self._summaries[p.id] for p in members if p.status == "ok" and p.id in self._summaries]  # fmt: skip
        self._stats[key] = {
            "engine": members[0].engine, "settings": members[0].settings, "rounds_ok": len(ok),
            "figures": {k: v.to_json() for k, v in combine(ok).items()},
        }  # fmt: skip

    def stats(self) -> list[dict[str, Any]]:
        """Per setting (engine and settings, in the order the points ran): its rounds that
        finished ok and their figures."""
        keys = list(dict.fromkeys(self._key(p) for p in self.ran()))
        for key in keys:
            if key not in self._stats:
                self._restat(key)
        return [self._stats[key] for key in keys]

    def document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "kind": self.kind, "rounds": self.rounds, "axes": self.axes,
            "points": [p.to_json() for p in self.ran()], "stats": self.stats(),
        }  # fmt: skip

    def write(self) -> list[Path]:
        self.root.mkdir(parents=True, exist_ok=True)
        data = orjson.dumps(self.document(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        return [_replace(self.root / "sweep.json", data), _replace(self.root / "sweep.csv", self.csv())]  # fmt: skip

    def csv(self) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        head = ["id", "engine", "concurrency", "request_rate", "num_speculative_tokens",
                "acceptance_length", "round", "status", "exit_code"]  # fmt: skip
        writer.writerow(head + [f"{f}_{part}" for f in FIGURES for part in ("mean", "low", "high")])
        for p in self.ran():
            row = [p.id, p.engine or "", *(_cell(p.settings[k]) for k in head[2:6]), p.round,
                   p.status, _cell(p.exit_code)]  # fmt: skip
            shown = p.figures if p.status == "ok" else None
            for name in FIGURES:
                iv = shown.get(name) if shown else None
                row += [_cell(v) for v in ((iv.mean, iv.low, iv.high) if iv else (None,) * 3)]
            writer.writerow(row)
        return out.getvalue().encode("utf-8")


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


def _replace(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename (a symbolic link planted
    at ``path`` is replaced, never written through)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path
