"""The header comments of an InferenceX golden acceptance-length file, read into facts.

InferenceX publishes one YAML file per model and drafter (``golden_al_distribution/``): a body
``{model: {thinking_on|thinking_off: {K: AL}}}`` under comment lines that say where it was measured.
Their wording differs from file to file, for example::

    # Source GitHub Actions run: https://github.com/OWNER/REPO/actions/runs/30304797750
    # Acceptance Length (AL) reference values measured with SPEED-Bench.
    # dataset: coding | top_p: 0.95 | output_len: 4096
    # thinking_on: temperature=1.0, chat_template_kwargs: {"thinking": true}
    # thinking_off: temp 0.7 top_p 0.8 top_k 20 presence_penalty 1.5 | chat_template_kwargs: {...}
    # speculative-config: method=dspark | draft_sample_method=probabilistic
    # Measured on kimi-k3 (B300, vLLM DSpark, draft: Inferact/Kimi-K3-DSpark), per ...

``read_header`` returns what the lines state and nothing more; a line it does not recognise is
ignored, a recognised line whose value is malformed is a ``Problem``. Library code: never prints.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any

from speclens.acceptance.errors import Problem

#: The speculative methods a header or file name can name, by their lower-case spelling.
METHODS = ("dspark", "eagle3", "mtp")
#: A GitHub Actions run: https://github.com/OWNER/REPO/actions/runs/ID (optionally /attempts/N).
RUN_URL = re.compile(
    r"https://github\.com/[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}"
    r"/actions/runs/[0-9]{1,20}(?:/attempts/[0-9]{1,4})?",
    re.ASCII,
)
#: Longest header line read; a longer comment line is not a header fact.
MAX_LINE = 2000
#: Header lines read at most; the header is the file's first comment block.
MAX_LINES = 200

_RUN = re.compile(r"source github actions run:\s*(.*)$", re.IGNORECASE)
_BENCHMARK = re.compile(r"measured with ([A-Za-z][\w.+-]*(?: [A-Z][\w.+-]*)*)", re.ASCII)
_MEASURED = re.compile(r"^measured on (\S+) \(([^()]*)\)", re.IGNORECASE)
_MODE = re.compile(r"^thinking_(on|off)\s*:?\s*(.*)$")
_KWARGS = re.compile(r"chat_template_kwargs:\s*(\{.*?\})\s*(?:\||$)")
_SPEC_CONFIG = re.compile(r"^speculative-config:\s*(.*)$", re.IGNORECASE)
_DATASET = re.compile(r"(?:^|\|)\s*dataset:\s*([A-Za-z0-9_-]+)\s*(?:\||$)")
_NUMBER = r"[-+]?[0-9]+(?:\.[0-9]+)?"
_SAMPLING = re.compile(
    r"\b(temperature|temp|top_p|top_k|output_len|max_tokens|presence_penalty)\s*[:= ]\s*"
    rf"({_NUMBER})(?![\w.])"
)
_NAMES = {"temp": "temperature", "output_len": "max_tokens"}
_INTEGERS = ("top_k", "max_tokens")
_SETTING = re.compile(r"^([A-Za-z_][\w-]*)=(\S+)$")


@dataclass
class GoldenHeader:
    """What a golden file's header states; None where it says nothing."""

    run: str | None = None
    benchmark: str | None = None
    category: str | None = None
    hardware: str | None = None
    engine: str | None = None
    method: str | None = None
    drafter: str | None = None
    #: Sampling that applies to every thinking mode (temperature, top_p, top_k, max_tokens).
    sampling: dict[str, float | int] = field(default_factory=dict)
    #: Per thinking mode ("on", "off"): sampling values that replace the common ones.
    mode_sampling: dict[str, dict[str, float | int]] = field(default_factory=dict)
    #: Engine settings that bear on acceptance (rejection_sample_method, ...).
    settings: dict[str, Any] = field(default_factory=dict)
    #: Per thinking mode: settings such as chat_template_kwargs and presence_penalty.
    mode_settings: dict[str, dict[str, Any]] = field(default_factory=dict)


def header_lines(text: str) -> list[tuple[int, str]]:
    """The leading comment block as (line number, text after '#'), at most ``MAX_LINES``."""
    out: list[tuple[int, str]] = []
    start = 0
    number = 0
    while start < len(text) and len(out) < MAX_LINES:
        end = text.find("\n", start, start + MAX_LINE + 1)
        line = text[start:] if end < 0 else text[start:end]
        number += 1
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if end < 0 and len(text) - start > MAX_LINE:
            break  # an overlong line: not a header
        if stripped.startswith("#") and len(line) <= MAX_LINE:
            out.append((number, stripped[1:].strip()))
        if end < 0:
            break
        start = end + 1
    return out


def method_from_name(name: str) -> str | None:
    """The method a file name names (``kimik3_dspark.yaml``), when it names exactly one."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    found = [m for m in METHODS if m in words]
    return found[0] if len(found) == 1 else None


def _shown(value: str) -> str:
    return reprlib.repr(value)


def _number(name: str, text: str) -> float | int:
    return int(float(text)) if name in _INTEGERS else float(text)


def _sampling(text: str) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for match in _SAMPLING.finditer(text):
        name = _NAMES.get(match[1], match[1])
        out[name] = _number(name, match[2])
    return out


def read_header(text: str, file: str) -> tuple[GoldenHeader, list[Problem]]:
    """The facts ``text``'s header comments state, and a problem for each malformed one."""
    header = GoldenHeader()
    problems: list[Problem] = []
    for number, line in header_lines(text):
        where = f"header line {number}"
        if match := _RUN.search(line):
            url = match[1].strip()
            if not RUN_URL.fullmatch(url):
                problems.append(
                    Problem(
                        file,
                        f"{where}: run",
                        "expected a GitHub Actions run URL "
                        f"(https://github.com/OWNER/REPO/actions/runs/ID), got {_shown(url)}",
                    )
                )
            else:
                header.run = url
            continue
        if match := _BENCHMARK.search(line):
            header.benchmark = match[1].rstrip(".")
        if match := _MEASURED.match(line):
            _measured(header, match[2])
            continue
        if match := _MODE.match(line):
            _mode(header, match[1], match[2], file, where, problems)
            continue
        if match := _SPEC_CONFIG.match(line):
            _spec_config(header, match[1])
            continue
        if match := _DATASET.search(line):
            header.category = match[1].lower()
            common = _sampling(line)
            header.sampling.update(common)
            if "presence_penalty" in common:
                header.settings["presence_penalty"] = header.sampling.pop("presence_penalty")
    return header, problems


def _measured(header: GoldenHeader, inside: str) -> None:
    """``B300, vLLM DSpark, draft: Inferact/Kimi-K3-DSpark``: chip, engine and method, drafter."""
    parts = [p.strip() for p in inside.split(",")]
    if parts and parts[0]:
        header.hardware = parts[0].lower()
    if len(parts) > 1 and parts[1]:
        words = parts[1].split()
        header.engine = words[0].lower()
        named = [w.lower() for w in words[1:] if w.lower() in METHODS]
        if len(named) == 1 and header.method is None:
            header.method = named[0]
    for part in parts[2:]:
        name, sep, value = part.partition(":")
        if sep and name.strip().lower() in ("draft", "drafter") and value.strip():
            header.drafter = value.strip()


def _mode(
    header: GoldenHeader, mode: str, rest: str, file: str, where: str, problems: list[Problem]
) -> None:
    settings = header.mode_settings.setdefault(mode, {})
    if match := _KWARGS.search(rest):
        try:
            kwargs = json.loads(match[1])
        except ValueError:
            kwargs = None
        if not isinstance(kwargs, dict):
            message = f"expected a JSON object, got {_shown(match[1])}"
            problems.append(
                Problem(file, f"{where}: thinking_{mode}.chat_template_kwargs", message)
            )
        else:
            settings["chat_template_kwargs"] = kwargs
        rest = rest[: match.start()] + rest[match.end() :]
    values = _sampling(rest)
    if "presence_penalty" in values:
        settings["presence_penalty"] = values.pop("presence_penalty")
    header.mode_sampling.setdefault(mode, {}).update(values)


def _spec_config(header: GoldenHeader, rest: str) -> None:
    for part in rest.split("|"):
        match = _SETTING.match(part.strip())
        if not match:
            continue
        name, value = match[1], match[2]
        if name == "method":
            header.method = value.lower()
        else:
            header.settings[name] = value
