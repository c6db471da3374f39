"""Run, sweep and compare directories for the report.html tests, and the checks both tiers share.

The runs are real: ``speclens bench`` against ``speclens serve --executor sim`` forced at K 7,
AL 3.78 (a passing verdict at concurrency 1, a failing one, expecting AL 3.0, at concurrency 2). The sweep and compare
directories are assembled from those runs: sweep.json in the shape its writer uses
(``runs.points.point_figures`` per point), compare.json as ``compare`` computes it (one
comparable pair).
"""

from __future__ import annotations

import math
import re
import shutil
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson

import launch
from serverkit import FORCED, running_server
from speclens.runs.html import resolve_field
from speclens.runs.points import point_figures


@dataclass
class ReportDirs:
    run_ok: Path
    run_fail: Path
    sweep: Path
    compare: Path


def bench(url: str, out: Path, *, expect: float, concurrency: int, code: int) -> Path:
    """One bench run into ``out``; asserts its exit code (0 PASS, 1 FAIL)."""
    proc = launch.run(
        [sys.executable, "-m", "speclens", "bench", "--url", url, "--model", "dummy",
         "--num-requests", "12", "--concurrency", str(concurrency), "--max-tokens", "40",
         "--ignore-eos", "--expect-acceptance-length", str(expect), "--output-dir", str(out)],
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def make_dirs(root: Path) -> ReportDirs:
    with running_server(
        root / "logs", *FORCED, "--executor", "sim", "--per-request-spec-decode-stats", "detailed"
    ) as server:
        run_ok = bench(server.url, root / "run-ok", expect=3.78, concurrency=1, code=0)
        run_fail = bench(server.url, root / "run-fail", expect=3.0, concurrency=2, code=1)
    sweep = make_sweep(root / "sweep", {1: run_ok, 2: run_fail})
    compare = make_compare(root / "compare", sweep, run_ok)
    return ReportDirs(run_ok, run_fail, sweep, compare)


def make_sweep(sweep_dir: Path, runs: dict[int, Path]) -> Path:
    """A one-round load sweep over concurrency from finished runs, and its report (a run whose
    verification failed is a failed point, exit code 1)."""
    from speclens.runs.html_sweep import write_sweep_report

    points, stats = [], []
    for c, run in runs.items():
        pid = f"c{c}-r0"
        shutil.copytree(run, sweep_dir / "points" / pid)
        settings = {"concurrency": c, "request_rate": None, "num_speculative_tokens": None,
                    "acceptance_length": None}  # fmt: skip
        code = orjson.loads((run / "summary.json").read_bytes())["verdict"]["passed"] is False
        points.append({"id": pid, "engine": None, "settings": settings, "round": 0,
                       "dir": f"points/{pid}", "status": "failed" if code else "ok",
                       "exit_code": int(code), "error": "verification FAIL" if code else None})  # fmt: skip
        figures = point_figures([sweep_dir / "points" / pid])
        stats.append({"engine": None, "settings": settings, "rounds_ok": 1,
                      "figures": {k: v.to_json() for k, v in figures.items()}})  # fmt: skip
    sweep = {"schema": "speclens.sweep/1", "kind": "load", "rounds": 1,
             "axes": {"concurrency": list(runs)}, "points": points, "stats": stats}  # fmt: skip
    (sweep_dir / "sweep.json").write_bytes(orjson.dumps(sweep, option=orjson.OPT_INDENT_2))
    write_sweep_report(sweep_dir)
    return sweep_dir


def make_compare(out_dir: Path, sweep: Path, run: Path) -> Path:
    """``compare``'s own output (``speclens.runs.compare``, as the command computes it) for the
    sweep (A) against ``run`` as a server 1.25 times as fast would have run it (B: the run's
    records over 0.8 of its duration), and its report: one comparable pair, a ratio at matched
    concurrency and a delta at matched interactivity, none of them written by hand."""
    from speclens.runs import compare as cmp
    from speclens.runs.compare_inputs import read_inputs
    from speclens.runs.html_compare import write_compare_report

    faster = out_dir.parent / f"{out_dir.name}-b"
    shutil.copytree(run, faster)
    summary = orjson.loads((faster / "summary.json").read_bytes())
    summary["figures"]["duration_s"] *= 0.8
    (faster / "summary.json").write_bytes(orjson.dumps(summary))
    data = cmp.compare(read_inputs([sweep, faster], ["A", "B"], [1, 1]))
    out_dir.mkdir(parents=True)
    (out_dir / "compare.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    write_compare_report(out_dir, data)
    return out_dir


# ------------------------------------------------------------------------------ page checks


class _Scan(HTMLParser):
    """Every data-field element's path and text, every tag's attributes, the style text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.fields: list[tuple[str, str]] = []
        self.styles: list[str] = []
        self._open: list[tuple[str, list[str]]] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        self._in_style = tag == "style"
        if "data-field" in attributes:
            self._open.append((str(attributes["data-field"]), []))

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False
        if tag == "span" and self._open:
            path, text = self._open.pop()
            self.fields.append((path, "".join(text)))

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)
        for _, text in self._open:
            text.append(data)


def scan(page: str) -> _Scan:
    parser = _Scan()
    parser.feed(page)
    return parser


_URL_IN_CSS = re.compile(r"@import|url\s*\(", re.IGNORECASE)


def external_references(page: str) -> list[str]:
    """What in the page could make a browser fetch anything: a src/href/srcset/poster/data
    that is not an in-page ``#fragment`` or a relative path, a stylesheet link, a script, an
    @import or url() in a style. Empty for a self-contained page."""
    found = []
    parsed = scan(page)
    for tag, attributes in parsed.tags:
        if tag in ("script", "link", "iframe", "object", "embed", "base"):
            found.append(f"<{tag}>")
        for name in ("src", "href", "xlink:href", "srcset", "poster", "data", "action"):
            value = (attributes.get(name) or "").strip()
            if not value and name not in attributes:
                continue
            if not (value.startswith("#") or _relative(value)):
                found.append(f"{tag} {name}={value!r}")
        if _URL_IN_CSS.search(attributes.get("style") or ""):
            found.append(f"{tag} style={attributes['style']!r}")
    found += [f"style: {s.strip()[:80]}" for s in parsed.styles if _URL_IN_CSS.search(s)]
    return found


def _relative(value: str) -> bool:
    return (
        bool(value) and ":" not in value and not value.startswith(("/", "\\")) and ".." not in value
    )


def field_mismatches(pairs: list[tuple[str, str]], data: Any) -> list[str]:
    """Each (data-field, shown text) whose number is not the file's value at that path, to
    the digits shown. Empty when the page agrees with the file."""
    bad = []
    for path, text in pairs:
        try:
            value = resolve_field(data, path)
        except KeyError as exc:
            bad.append(f"{path}: not in the file ({exc})")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            bad.append(f"{path}: the file holds {value!r}, not a number")
            continue
        shown = text.strip().replace(",", "")
        try:
            number = float(shown)
        except ValueError:
            bad.append(f"{path}: shown as {text!r}")
            continue
        digits = len(shown.partition(".")[2])
        if isinstance(value, int) and "." not in shown:
            ok = number == value
        else:
            ok = math.isclose(round(value, digits), number, abs_tol=10**-digits * 0.501)
        if not ok:
            bad.append(f"{path}: shown {text!r}, the file holds {value!r}")
    return bad
