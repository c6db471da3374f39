"""A sweep file (YAML): per engine a server command template whose placeholders ({port}, {k},
{al}, {forcing}) are filled for each setting, its health route and startup bound, and the axes
it varies. The file is checked whole before any server starts: the schema, the placeholders,
the axes each placeholder needs, a command that does not split, a program that is not found.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from speclens.acceptance import Problem, ValidationError
from speclens.acceptance.files import key_mark, read_yaml, validate
from speclens.acceptance.quantity import num_spec_tokens_problem

PLACEHOLDERS = ("port", "k", "al", "forcing")
#: Engines whose forcing line ``{forcing}`` can be (``speclens profiles resolve --emit``).
EMIT_ENGINES = ("vllm", "atom", "sglang", "trtllm")
MAX_STARTUP_S = 3600.0
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
