"""Readers of published results: InferenceX's benchmark points and ``vllm bench serve
--save-result`` files, each turned into aggregate-only summaries (``runs.published``' shape).

Both are bounded before they are parsed (``MAX_FILE_BYTES``, checked from the file's size;
``MAX_POINTS`` points, counted as they are decoded one at a time) and as they are decoded (an
integer of more than ``MAX_INT_DIGITS`` digits is never converted, a value nested deeper than
``MAX_DEPTH`` is refused), and every field a summary is built from is checked: a bad value raises
InputError (exit 1) with one line, ``<file>: [<index>].<field>: <what was expected>, got
<value>``. JSON's NaN and Infinity tokens are read so that the field holding one is named. A
summary is then checked as its readers check it (``rundir.aggregate_problems``): nothing is
written that compare, sim or calibrate would refuse.

InferenceX points (``benchmarks.json``, ``benchmarks-history.json``: a JSON list of objects)
are deduplicated across files (one point is the same when every published key but ``metrics``
and ``image`` is equal; its metrics must agree where both copies have them, and are merged),
filtered (``--where KEY=VALUE``, compared as text), and grouped into configurations, one sweep
each, named ``<model>-<hardware>-<engine>-<precision>-<isl>x<osl>-tp<N>[-ep<N>][-dpa]-<mtp|nomtp>-<date>``
(a disaggregated one names its prefill and decode layouts instead of the TP part:
``p<workers>x<tp...>-d<workers>x<tp...>``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from speclens.acceptance.quantity import (
    MAX_NUM_SPEC_TOKENS,
    is_finite_number,
    length_problems,
    rates_shape_problems,
    rates_sum_problem,
)
from speclens.runs.rundir import InputError, aggregate_problems, is_int

#: The largest published file read, in bytes (refused from its size, before it is read).
MAX_FILE_BYTES = 64 * 2**20
#: The most points one InferenceX file may hold (counted as they are decoded).
MAX_POINTS = 100_000
#: The deepest a published value may nest (a point is an object: 1; its metrics: 2; InferenceX's
#: deepest, ``workers``, is 4). Deeper is refused as it is read, before anything copies it.
MAX_DEPTH = 32
#: The most digits an integer in a published file may have: no count (at most 2**63 - 1) and no
#: float (at most about 1.8e308) holds more, and converting a longer one costs time quadratic in
#: its length. A longer one is read as ``Oversized``, refused by the field that holds it.
MAX_INT_DIGITS = 400
#: Catalog names of InferenceX's model codes.
MODELS = {"dsr1": "deepseek-r1"}
#: The published top-level keys ``--where`` filters on (besides any other scalar key a file has).
WHERE_KEYS = (
    "hardware", "framework", "model", "precision", "spec_method", "disagg", "is_multinode",
    "prefill_tp", "prefill_ep", "prefill_dp_attention", "prefill_num_workers", "decode_tp",
    "decode_ep", "decode_dp_attention", "decode_num_workers", "num_prefill_gpu",
    "num_decode_gpu", "isl", "osl", "conc", "image", "date", "run_url",
)  # fmt: skip
#: Keys whose values are not one value (``--where`` cannot compare them).
_NOT_SCALAR = ("metrics", "workers")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}\Z")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}\Z")
#: InferenceX's latency metrics (seconds) and their summary names (milliseconds).
LATENCY = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}


class Oversized:
    """An integer literal of more than ``MAX_INT_DIGITS`` digits, read but never converted."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits:,} digits"


def _parse_int(text: str) -> int | Oversized:
    digits = len(text) - text.startswith("-")
    return Oversized(digits) if digits > MAX_INT_DIGITS else int(text)


def _decoder() -> json.JSONDecoder:
    return json.JSONDecoder(parse_int=_parse_int)


def _got(value: object) -> str:
    return f"{value!r:.60}"


def _finite(value: object, low: float = 0.0, strict: bool = False) -> bool:
    """A finite number (an int too large for a float is not) >= ``low`` (> with ``strict``)."""
    if not is_finite_number(value):
        return False
    return float(value) > low if strict else float(value) >= low  # type: ignore[arg-type]


def _integer(value: object, low: int) -> bool:
    """An integer >= ``low`` that every run reader takes as a count (``rundir.is_int``)."""
    return is_int(value) and value >= low


def _path(trail: tuple[Any, ...] | None, where: str) -> str:
    keys = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    parts = [f"[{k}]" if isinstance(k, int) else (f".{k}" if _NAME.match(k) else f"[{k!r:.40}]")
             for k in reversed(keys)]  # fmt: skip
    if parts and where.endswith(" ") and parts[0].startswith("."):
        parts[0] = parts[0][1:]  # "<file>: key", as the vLLM reader names its fields
    if len(parts) > 8:  # the line stays short: the way in, and how deep
        parts = [*parts[:8], f"...(depth {len(parts) + 1})"]
    return (where + "".join(parts)).rstrip()


def shape_problem(value: object, where: str) -> str | None:
    """A value nested deeper than ``MAX_DEPTH``, or an ``Oversized`` integer, anywhere in
    ``value``, named by its path (``where`` names ``value`` itself)."""
    stack: list[tuple[object, int, tuple[Any, ...] | None]] = [(value, 1, None)]
    while stack:
        item, depth, trail = stack.pop()
        if isinstance(item, Oversized):
            return (f"{_path(trail, where)}: expected a number of at most {MAX_INT_DIGITS} "
                    f"digits, got {item!r}")  # fmt: skip
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_DEPTH:
            return (f"{_path(trail, where)}: nested deeper than {MAX_DEPTH} levels: expected at "
                    f"most {MAX_DEPTH}")  # fmt: skip
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        stack.extend((v, depth + 1, (trail, k)) for k, v in pairs)
    return None


# ------------------------------------------------------------------------ reading a file
def _read_text(path: Path) -> str:
    """The file's text, refused (one line) above ``MAX_FILE_BYTES`` from its size alone."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InputError([f"{path}: {size:,} bytes: expected a published file of at most "
                              f"{MAX_FILE_BYTES:,} bytes"], 1)  # fmt: skip
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError([f"{path}: cannot be read: {exc.strerror or exc}"], 1) from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError([f"{path}: expected a published file of at most {MAX_FILE_BYTES:,} bytes"], 1)  # fmt: skip
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError([f"{path}: not UTF-8 text (byte {exc.start})"], 1) from None


def _not_json(path: Path, exc: json.JSONDecodeError) -> InputError:
    return InputError([f"{path}: not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"], 1)


def iter_list(path: Path, text: str, limit: int | None = None) -> Iterable[tuple[int, Any]]:
    """The elements of the JSON list ``text``, decoded one at a time: more than ``limit``
    (default ``MAX_POINTS``) is refused when the next element starts, before it (or anything
    after it) is decoded."""
    limit = MAX_POINTS if limit is None else limit
    decoder = _decoder()
    ws = re.compile(r"[ \t\n\r]*")
    pos = ws.match(text, 0).end()  # type: ignore[union-attr]
    if not text.startswith("[", pos):
        raise InputError([f"{path}: expected a JSON list of points, got "
                          f"{text[pos:pos + 20]!r}"], 1)  # fmt: skip
    pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
    if text.startswith("]", pos):
        return
    index = 0
    while True:
        if index >= limit:
            raise InputError([f"{path}: more than {limit:,} points: expected at most {limit:,}"], 1)  # fmt: skip
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise _not_json(path, exc) from None
        except RecursionError:
            raise InputError([f"{path}: [{index}]: nested too deeply"], 1) from None
        yield index, value
        index += 1
        pos = ws.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith("]", pos):
            end = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
            if end != len(text):
                raise InputError([f"{path}: not JSON: extra data after the list (character {end})"], 1)  # fmt: skip
            return
        if not text.startswith(",", pos):
            raise InputError([f"{path}: not JSON: expected ',' or ']' after [{index - 1}] "
                              f"(character {pos})"], 1)  # fmt: skip
        pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]


# --------------------------------------------------------------------- InferenceX points
@dataclass
class Published:
    """One InferenceX point, checked, and where it came from."""

    file: str
    index: int
    data: dict[str, Any]

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.data["metrics"])


_REQUIRED_NAMES = ("hardware", "framework", "model", "precision", "spec_method")
_POSITIVE = ("conc", "isl", "osl", "decode_tp", "decode_ep")
_COUNTS = ("prefill_tp", "prefill_ep")
_ZERO_OR_MORE = ("num_prefill_gpu", "num_decode_gpu", "prefill_num_workers", "decode_num_workers")
_FLAGS = ("disagg", "decode_dp_attention")
_OPTIONAL_FLAGS = ("prefill_dp_attention", "is_multinode")


def point_problem(point: object, where: str) -> str | None:
    """The first thing wrong with one InferenceX point (``where``: ``<file>: [<index>]``)."""
    if not isinstance(point, dict):
        return f"{where}: expected a point (a JSON object), got {_got(point)}"

    def bad(field: str, what: str) -> str:
        return f"{where}.{field}: expected {what}, got " + (_got(point[field]) if field in point else "nothing")  # fmt: skip

    for key in _REQUIRED_NAMES:
        if not (isinstance(point.get(key), str) and _NAME.match(point[key])):
            return bad(key, "a name (letters, digits, '.', '_', '+', '-'; at most 64)")
    if not (isinstance(point.get("date"), str) and _DATE.match(point["date"])):
        return bad("date", "a date YYYY-MM-DD")
    for key in _POSITIVE:
        if not _integer(point.get(key), 1):
            return bad(key, "an integer >= 1")
    for key in _COUNTS:
        if key in point and not _integer(point[key], 1):
            return bad(key, "an integer >= 1")
    for key in _ZERO_OR_MORE:
        if key in point and not _integer(point[key], 0):
            return bad(key, "an integer >= 0")
    for key in _FLAGS:
        if not isinstance(point.get(key), bool):
            return bad(key, "true or false")
    for key in _OPTIONAL_FLAGS:
        if key in point and not isinstance(point[key], bool):
            return bad(key, "true or false")
    if point["disagg"]:
        for key in ("num_prefill_gpu", "num_decode_gpu"):
            if not _integer(point.get(key), 1):
                return bad(key, "an integer >= 1 (a disaggregated point's GPUs)")
    for key, most in (("run_url", 2048), ("image", 256)):
        value = point.get(key)
        if value is not None and not (isinstance(value, str) and 0 < len(value) <= most):
            return bad(key, f"null or text of at most {most} characters")
    metrics = point.get("metrics")
    if not isinstance(metrics, dict):
        return bad("metrics", "the published metrics (an object)")
    return _metrics_problem(metrics, f"{where}.metrics")


def _metrics_problem(metrics: dict[str, Any], where: str) -> str | None:
    def bad(field: str, what: str) -> str:
        return f"{where}.{field}: expected {what}, got " + (_got(metrics[field]) if field in metrics else "nothing")  # fmt: skip

    if not _finite(metrics.get("median_tpot"), strict=True):
        return bad("median_tpot", "seconds > 0")
    for name in LATENCY:
        for stat in STATS:
            key = f"{stat}_{name}"
            if metrics.get(key) is not None and not _finite(metrics[key]):
                return bad(key, "null or seconds >= 0")
    if not _finite(metrics.get("tput_per_gpu")):
        return bad("tput_per_gpu", "tokens/s per GPU >= 0")
    for key in ("output_tput_per_gpu", "input_tput_per_gpu", "median_intvty", "mean_intvty"):
        if metrics.get(key) is not None and not _finite(metrics[key]):
            return bad(key, "null or a number >= 0")
    return None


def read_inferencex(path: Path, label: str | None = None) -> list[Published]:
    """Every point of one InferenceX file, each checked; InputError (1) names the first bad
    one. ``label``: the file as the user gave it (default ``str(path)``)."""
    name = label if label is not None else str(path)
    text = _read_text(Path(path))
    out = []
    for index, point in iter_list(Path(name), text):
        problem = point_problem(point, f"{name}: [{index}]") or shape_problem(point, f"{name}: [{index}]")  # fmt: skip
        if problem:
            raise InputError([problem], 1)
        out.append(Published(name, index, point))
    return out


def _identity(point: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in point.items() if k not in ("metrics", "image")},
                      sort_keys=True, allow_nan=True)  # fmt: skip


def _same(a: object, b: object) -> bool:
    """Equal, NaN counting as equal to NaN (a copy of a point repeats its NaN metrics)."""
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def dedupe(points: Sequence[Published]) -> tuple[list[Published], int]:
    """One point per published identity (every key but metrics and image), in first-seen
    order, the copies' metrics merged; and how many copies were merged. InputError (1) when
    two copies disagree on a metric both have."""
    kept: dict[str, Published] = {}
    merged = 0
    for point in points:
        key = _identity(point.data)
        first = kept.get(key)
        if first is None:
            kept[key] = Published(point.file, point.index, dict(point.data))
            continue
        merged += 1
        mine, theirs = first.data["metrics"], point.data["metrics"]
        for name in sorted(set(mine) & set(theirs)):
            if not _same(mine[name], theirs[name]):
                raise InputError([f"{point.file}: [{point.index}].metrics.{name}: expected "
                                  f"{mine[name]!r} as the same point in {first.file} "
                                  f"[{first.index}] has it, got {theirs[name]!r}"], 1)  # fmt: skip
        first.data["metrics"] = {**theirs, **mine}
        if first.data.get("image") is None and point.data.get("image") is not None:
            first.data["image"] = point.data["image"]
    return list(kept.values()), merged


# ------------------------------------------------------------------------------ --where
def parse_where(values: Sequence[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` pairs; InputError (2) for one without ``=`` or a key."""
    out = []
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key.strip():
            raise InputError([f"command line: --where: expected KEY=VALUE, got {value!r:.80}"], 2)
        out.append((key.strip(), text.strip()))
    return out


def as_text(value: object) -> str:
    """A published value as ``--where`` compares it: true/false, null, numbers as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return str(int(value)) if math.isfinite(value) and value == int(value) else f"{value:g}"
    return str(value)


def known_keys(points: Iterable[Published]) -> list[str]:
    keys = dict.fromkeys(WHERE_KEYS)
    for point in points:
        keys.update(dict.fromkeys(k for k in point.data if k not in _NOT_SCALAR))
    return list(keys)


def select(points: Sequence[Published], where: Sequence[tuple[str, str]]) -> list[Published]:
    """The points every key matches (values given for one key: any of them). InputError (2)
    names a key no published point has, with the known keys."""
    known = known_keys(points)
    unknown = [k for k, _ in where if k not in known]
    if unknown:
        raise InputError([f"command line: --where: unknown key {unknown[0]!r:.60}: expected one "
                          f"of {', '.join(known)}"], 2)  # fmt: skip
    wanted: dict[str, set[str]] = {}
    for key, value in where:
        wanted.setdefault(key, set()).add(value)
    return [p for p in points
            if all(as_text(p.data.get(k)) in values for k, values in wanted.items())]  # fmt: skip


# ---------------------------------------------------------------------- the summaries
def readable(summary: dict[str, Any], where: str) -> dict[str, Any]:
    """``summary`` when its readers (compare, sim, calibrate: ``rundir.aggregate_problems``)
    take every field of it; else InputError (1) naming the first field they would refuse, so
    that nothing is written that cannot be read back."""
    problems = aggregate_problems(summary, where)
    if problems:
        raise InputError([f"{problems[0]} (in the summary made from it)"], 1)
    return summary


def num_spec_tokens(point: Mapping[str, Any]) -> int | None:
    """K of an MTP point where InferenceX's benchmark scripts state it (its README's table):
    SGLang 2 on h200/b200/b300 and 3 on mi325x/mi355x, ATOM 3, TensorRT-LLM 3 (1 with
    attention data parallelism); None for speculation off and for every other engine."""
    if point.get("spec_method") != "mtp":
        return None
    engine, chip = point.get("framework"), point.get("hardware")
    if engine == "sglang":
        return {"h200": 2, "b200": 2, "b300": 2, "mi325x": 3, "mi355x": 3}.get(str(chip))
    if engine == "atom":
        return 3
    if engine == "trt":
        return 1 if point.get("decode_dp_attention") else 3
    return None


def gpus(point: Mapping[str, Any]) -> int:
    """The GPUs a point ran on. Single node: ``decode_tp`` (the published ``num_decode_gpu``
    is TP x EP, 64 for TP 8 / EP 8 on one 8-GPU node; the published throughput per GPU is
    per ``decode_tp`` GPUs). Disaggregated: the prefill and decode GPUs together."""
    if point["disagg"]:
        return int(point["num_prefill_gpu"]) + int(point["num_decode_gpu"])
    return int(point["decode_tp"])


def _parallel(tp: Any, ep: Any, dpa: Any) -> str:
    return f"tp{tp}" + (f"-ep{ep}" if _integer(ep, 2) else "") + ("-dpa" if dpa else "")


def configuration_name(point: Mapping[str, Any]) -> str:
    """``<model>-<hardware>-<engine>-<precision>-<isl>x<osl>-<parallelism>-<mtp|nomtp>-<date>``
    (``model`` as published: InferenceX's code, ``dsr1``)."""
    p = point
    if p["disagg"]:
        layout = (f"p{p.get('prefill_num_workers', 0)}x"
                  f"{_parallel(p.get('prefill_tp'), p.get('prefill_ep'), p.get('prefill_dp_attention'))}"
                  f"-d{p.get('decode_num_workers', 0)}x"
                  f"{_parallel(p['decode_tp'], p['decode_ep'], p['decode_dp_attention'])}")  # fmt: skip
    else:
        layout = _parallel(p["decode_tp"], p["decode_ep"], p["decode_dp_attention"])
    spec = "nomtp" if p["spec_method"] == "none" else p["spec_method"]
    return f"{p['model']}-{p['hardware']}-{p['framework']}-{p['precision']}-{p['isl']}x{p['osl']}-{layout}-{spec}-{p['date']}"  # fmt: skip


#: The published metrics a summary is built from (and checked): a point's record in
#: ``provenance.published`` keeps these and the published keys (``WHERE_KEYS``), nothing else.
PUBLISHED_METRICS = ("median_tpot", "tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu",
                     "median_intvty", "mean_intvty",
                     *(f"{stat}_{name}" for name in LATENCY for stat in STATS))  # fmt: skip


def published_record(point: Mapping[str, Any]) -> dict[str, Any]:
    """What ``provenance.published`` keeps of a checked point: its published keys and the
    metrics a summary is built from, each checked (so bounded); never an unknown key, whatever
    it holds."""
    out = {k: point[k] for k in WHERE_KEYS if k in point}
    metrics = point["metrics"]
    out["metrics"] = {k: metrics[k] for k in PUBLISHED_METRICS if k in metrics}
    return out


def _ms(value: Any) -> float | None:
    return None if value is None else float(value) * 1000.0


def _latency(metrics: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    out = {}
    for name, shown in LATENCY.items():
        dist = {"mean": _ms(metrics.get(f"mean_{name}")), "p50": _ms(metrics.get(f"median_{name}")),
                "p99": _ms(metrics.get(f"p99_{name}"))}  # fmt: skip
        if metrics.get(f"p90_{name}") is not None:
            dist["p90"] = _ms(metrics[f"p90_{name}"])
        out[shown] = dist
    return out


def _times(value: Any, factor: int) -> float | None:
    return None if value is None else float(value) * factor


def _tag(image: Any) -> str | None:
    if not isinstance(image, str) or ":" not in image.rsplit("/", 1)[-1]:
        return None
    return image.rsplit(":", 1)[1] or None


def inferencex_summary(point: Published) -> dict[str, Any]:
    """The aggregate-only summary of one checked InferenceX point."""
    p, m = point.data, point.data["metrics"]
    n = gpus(p)
    model = MODELS.get(p["model"], p["model"])
    method = None if p["spec_method"] == "none" else p["spec_method"]
    settings = {
        "model": model, "hardware": p["hardware"], "engine": p["framework"],
        "image": p.get("image"), "precision": p["precision"],
        "tensor_parallel": p["decode_tp"], "expert_parallel": p["decode_ep"],
        "dp_attention": p["decode_dp_attention"], "gpus": n, "disaggregated": p["disagg"],
        "input_tokens": {"min": p["isl"], "max": p["isl"]},
        "output_tokens": {"min": p["osl"], "max": p["osl"]}, "max_tokens": p["osl"],
        "concurrency": p["conc"], "request_rate": None, "method": method,
        "num_spec_tokens": num_spec_tokens(p), "date": p["date"], "dataset": "random",
        "stream": True, "temperature": None, "executor": None,
    }  # fmt: skip
    if p["disagg"]:
        settings["prefill"] = {"tensor_parallel": p.get("prefill_tp"), "expert_parallel": p.get("prefill_ep"),
                               "dp_attention": p.get("prefill_dp_attention"),
                               "workers": p.get("prefill_num_workers"), "gpus": p["num_prefill_gpu"]}  # fmt: skip
        settings["decode"] = {"tensor_parallel": p["decode_tp"], "expert_parallel": p["decode_ep"],
                              "dp_attention": p["decode_dp_attention"],
                              "workers": p.get("decode_num_workers"), "gpus": p["num_decode_gpu"]}  # fmt: skip
    output_per_gpu, total_per_gpu = m.get("output_tput_per_gpu"), m["tput_per_gpu"]
    return readable(
        {
            "aggregate_only": True,
            "settings": settings,
            "server": {
                "engine": p["framework"],
                "version": _tag(p.get("image")),
                "model": model,
                "hardware": p["hardware"],
            },
            "provenance": {
                "source": "inferencex",
                "run_url": p.get("run_url"),
                "file": point.file,
                "index": point.index,
                "configuration": configuration_name(p),
                "published": published_record(p),
            },
            "figures": {
                "aggregate_only": True,
                "latency_ms": _latency(m),
                "throughput": {
                    "output_tokens_per_s": _times(output_per_gpu, n),
                    "total_tokens_per_s": _times(total_per_gpu, n),
                    "output_tokens_per_s_per_gpu": output_per_gpu,
                    "total_tokens_per_s_per_gpu": total_per_gpu,
                },
                "interactivity": {"p50": m.get("median_intvty"), "mean": m.get("mean_intvty")},
                "acceptance": None,
            },
        },
        f"{point.file}: [{point.index}]",
    )


def configurations(points: Sequence[Published]) -> dict[str, list[dict[str, Any]]]:
    """The points' summaries by configuration name (names sorted, each configuration's points
    by concurrency). InputError (1) for two points of one configuration at one concurrency."""
    groups: dict[str, dict[int, Published]] = {}
    for point in points:
        name = configuration_name(point.data)
        at = groups.setdefault(name, {})
        other = at.get(point.data["conc"])
        if other is not None:
            raise InputError([f"{point.file}: [{point.index}]: configuration {name} at "
                              f"concurrency {point.data['conc']} is also {other.file} "
                              f"[{other.index}] (another run: {other.data.get('run_url')}): "
                              "expected one point per concurrency"], 1)  # fmt: skip
        at[point.data["conc"]] = point
    return {name: [inferencex_summary(at[c]) for c in sorted(at)] for name, at in sorted(groups.items())}  # fmt: skip


# ------------------------------------------------------------------ vllm bench serve
_VLLM_LATENCY = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
_VLLM_STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}


def _vllm_problem(data: dict[str, Any], where: str) -> str | None:
    def bad(field: str, what: str) -> str:
        return f"{where}: {field}: expected {what}, got " + (_got(data[field]) if field in data else "nothing")  # fmt: skip

    model = data.get("model_id")
    if not (isinstance(model, str) and 0 < len(model) <= 256):
        return bad("model_id", "the model's name (text of at most 256 characters)")
    if not _integer(data.get("completed"), 1):
        return bad("completed", "an integer >= 1 (requests that finished)")
    if data.get("failed") is not None and not _integer(data["failed"], 0):
        return bad("failed", "null or an integer >= 0")
    if not _finite(data.get("duration"), strict=True):
        return bad("duration", "seconds > 0")
    if data.get("max_concurrency") is not None and not _integer(data["max_concurrency"], 1):
        return bad("max_concurrency", "null or an integer >= 1")
    rate = data.get("request_rate")
    if rate is not None and rate != "inf" and not _finite(rate, strict=True):
        return bad("request_rate", '"inf" or requests/s > 0')
    if data.get("num_prompts") is not None and not _integer(data["num_prompts"], 1):
        return bad("num_prompts", "null or an integer >= 1")
    for key in ("backend", "label", "tokenizer_id", "date"):
        value = data.get(key)
        if value is not None and not (isinstance(value, str) and len(value) <= 256):
            return bad(key, "null or text of at most 256 characters")
    if not _finite(data.get("median_tpot_ms"), strict=True):
        return bad("median_tpot_ms", "milliseconds > 0")
    for name in _VLLM_LATENCY:
        for stat in _VLLM_STATS:
            key = f"{stat}_{name}_ms"
            if data.get(key) is not None and not _finite(data[key]):
                return bad(key, "null or milliseconds >= 0")
    if not _finite(data.get("output_throughput")):
        return bad("output_throughput", "tokens/s >= 0")
    for key in ("total_token_throughput", "request_throughput"):
        if data.get(key) is not None and not _finite(data[key]):
            return bad(key, "null or a number >= 0")
    for key in ("total_input_tokens", "total_output_tokens"):
        if data.get(key) is not None and not _integer(data[key], 0):
            return bad(key, "null or an integer >= 0")
    for key in ("input_lens", "output_lens"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list) and value and all(_integer(v, 0) for v in value)):  # fmt: skip
            return bad(key, "null or a list of token counts")
    if data.get("burstiness") is not None and not _finite(data["burstiness"], strict=True):
        return bad("burstiness", "null or a number > 0")
    method = data.get("method")
    if method is not None and not (isinstance(method, str) and 0 < len(method) <= 256):
        return bad("method", "null or the speculative method's name (text of at most 256 characters)")  # fmt: skip
    for key in (
        "spec_decode_num_drafts",
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
    ):
        if data.get(key) is not None and not _integer(data[key], 0):
            return bad(key, "null or an integer >= 0")
    rate = data.get("spec_decode_acceptance_rate")
    if rate is not None and not (_finite(rate) and rate <= 100):
        return bad("spec_decode_acceptance_rate", "null or a percentage in [0, 100]")
    return _acceptance_problem(data, bad)


def _acceptance_problem(data: dict[str, Any], bad: Callable[[str, str], str]) -> str | None:
    """The AL and per-position rates as every AL reader checks them (``acceptance.quantity``):
    rates in [0, 1], at most ``MAX_NUM_SPEC_TOKENS`` of them (their count is K), never rising,
    summing to AL - 1; AL in [1, K + 1] (K + 1 at most ``MAX_NUM_SPEC_TOKENS`` + 1 when no
    rates give K)."""
    rates_key, al_key = "spec_decode_per_position_acceptance_rates", "spec_decode_acceptance_length"  # fmt: skip
    rates = data.get(rates_key)
    if rates is not None:
        if not (isinstance(rates, list) and 1 <= len(rates) <= MAX_NUM_SPEC_TOKENS
                and all(_finite(r) and r <= 1 for r in rates)):  # fmt: skip
            return bad(rates_key, f"null or 1 to {MAX_NUM_SPEC_TOKENS} rates in [0, 1] (one a "
                       "draft position)")  # fmt: skip
        shape = rates_shape_problems(rates, None, rates_key)
        if shape:
            return bad(rates_key, f"rates that never rise with the position ({shape[0].message})")
    al = data.get(al_key)
    if al is None:
        return None
    k = len(rates) if rates else MAX_NUM_SPEC_TOKENS
    what = (
        f"K = {k}, the per-position rates' count" if rates else f"K at most {MAX_NUM_SPEC_TOKENS}"
    )
    if length_problems(al, k):
        return bad(al_key, f"null or an AL in [1, {k + 1}] ({what})")
    mismatch = rates_sum_problem([float(r) for r in rates], float(al)) if rates else None
    if mismatch:
        return bad(rates_key, f"rates summing to {al_key} - 1 (they {mismatch})")
    return None


def _vllm_date(value: Any) -> str | None:
    try:
        return datetime.strptime(str(value), "%Y%m%d-%H%M%S").date().isoformat()
    except ValueError:
        return None


def _lengths(values: Any) -> dict[str, int] | None:
    return {"min": min(values), "max": max(values)} if isinstance(values, list) and values else None


def _acceptance(data: Mapping[str, Any]) -> tuple[dict[str, Any] | None, int | None]:
    al = data.get("spec_decode_acceptance_length")
    if al is None:
        return None, None
    drafts, tokens = data.get("spec_decode_num_drafts"), data.get("spec_decode_draft_tokens")
    # K is the number of per-position rates vLLM publishes; draft tokens over drafts is not K
    # where a drafter proposes fewer (n-gram: a real vLLM at K 4 gave exactly 3 a draft).
    positions = data.get("spec_decode_per_position_acceptance_rates")
    k = len(positions) if isinstance(positions, list) and positions else None
    rate = data.get("spec_decode_acceptance_rate")
    return {
        "acceptance_length": float(al), "num_spec_tokens": k,
        "acceptance_rate": float(rate) / 100.0 if rate is not None and _finite(rate) else None,
        "num_drafts": drafts, "draft_tokens": tokens,
        "accepted_tokens": data.get("spec_decode_accepted_tokens"),
        "per_position_rates": data.get("spec_decode_per_position_acceptance_rates"),
        "source": "vLLM's server counters over the run (vllm bench serve)",
    }, k  # fmt: skip


def vllm_summary(path: Path, label: str | None = None, gpus: int | None = None,
                 hardware: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The aggregate-only summary of one ``vllm bench serve --save-result`` file, checked (the
    same bounds as InferenceX files); throughput per GPU only where ``gpus`` is given."""
    name = label if label is not None else str(path)
    text = _read_text(Path(path))
    try:
        data = _decoder().decode(text)
    except json.JSONDecodeError as exc:
        raise _not_json(Path(name), exc) from None
    except RecursionError:
        raise InputError([f"{name}: nested too deeply"], 1) from None
    if not isinstance(data, dict):
        raise InputError([f"{name}: expected one result object (vllm bench serve "
                          f"--save-result), got {type(data).__name__}"], 1)  # fmt: skip
    problem = _vllm_problem(data, name) or shape_problem(data, f"{name}: ")
    if problem:
        raise InputError([problem], 1)
    latency = {}
    for key, shown in _VLLM_LATENCY.items():
        dist = {s: data.get(f"{stat}_{key}_ms") for stat, s in _VLLM_STATS.items()}
        if any(v is not None for v in dist.values()):
            latency[shown] = {s: (None if v is None else float(v)) for s, v in dist.items()}
    rate = data.get("request_rate")
    acceptance, k = _acceptance(data)
    method = data.get("method") if isinstance(data.get("method"), str) else None
    if acceptance is not None and method is None:
        method = "unknown"
    output, total = float(data["output_throughput"]), data.get("total_token_throughput")
    model = data["model_id"]
    return readable({
        "aggregate_only": True,
        "settings": {
            "model": model, "hardware": hardware, "engine": "vllm", "image": None,
            "precision": None, "tensor_parallel": None, "expert_parallel": None,
            "dp_attention": None, "gpus": gpus, "disaggregated": None,
            "input_tokens": _lengths(data.get("input_lens")),
            "output_tokens": _lengths(data.get("output_lens")), "max_tokens": None,
            "concurrency": data.get("max_concurrency"),
            "request_rate": None if rate in (None, "inf") else float(rate),
            "burstiness": data.get("burstiness"), "num_requests": data.get("num_prompts"),
            "backend": data.get("backend"), "method": method, "num_spec_tokens": k,
            "date": _vllm_date(data.get("date")), "dataset": None, "stream": None,
            "temperature": None, "executor": None,
        },
        "server": {"engine": "vllm", "version": None, "model": model, "hardware": hardware},
        "provenance": {"source": "vllm", "run_url": None, "file": name, "index": None,
                       "label": data.get("label"), "tokenizer_id": data.get("tokenizer_id")},
        "figures": {
            "aggregate_only": True,
            "duration_s": float(data["duration"]),
            "requests": {"completed": data["completed"], "failed": data.get("failed"), "warmup": 0},
            "latency_ms": latency,
            "throughput": {
                "output_tokens_per_s": output,
                "total_tokens_per_s": None if total is None else float(total),
                "requests_per_s": data.get("request_throughput"),
                "output_tokens_per_s_per_gpu": output / gpus if gpus else None,
                "total_tokens_per_s_per_gpu": float(total) / gpus if gpus and total is not None else None,
                "total_output_tokens": data.get("total_output_tokens"),
                "total_prompt_tokens": data.get("total_input_tokens"),
            },
            "interactivity": None,
            "acceptance": acceptance,
        },
    }, name)  # fmt: skip
