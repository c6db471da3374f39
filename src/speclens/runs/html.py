"""report.html's frame: the document every page is, and what the pages share.

The page is self-contained so it reads the same from a file, a CI artifact or an e-mail
attachment: no script, one inline style sheet, plots as inline SVG (matplotlib, text as
paths), and a Content-Security-Policy that forbids every fetch, so a string from a server
cannot make the page load anything either. Every number taken from the JSON file carries
``data-field="<path>"`` (``figures.latency_ms.ttft.mean``, ``stats[0].figures.realized_al.low``,
``replicas["http://a:1"].figures.requests.completed``; see ``resolve_field``), so a test can
compare the page to the file. Plots are drawn from aggregates and downsampled samples, so a
run of 100k requests renders in about the time of a small one.

Each page type is a module of its own: a run (``html_run``), an aggregate-only run
(``html_aggregate``), a sweep (``html_sweep``), a compare (``html_compare``) and a K schedule
(``html_schedule``); the plots are ``html_plots``.
"""

from __future__ import annotations

import html
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from speclens.runs.files import open_new
from speclens.runs.rundir import is_number

#: The largest summary.json, sweep.json or compare.json a report reads.
MAX_JSON_BYTES = 64 * 1024 * 1024
#: Rows in a table listing per-key entries (categories, replicas, points).
MAX_TABLE_ROWS = 2000

REPORT_NAME = "report.html"
#: What a figure with no evidence behind it reads, on a page and in the console (a category
#: with no verify step has no AL; its 1.0 is the formula's empty case).
NO_DATA = "no data"
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;
max-width:72em;padding:0 1em;color:#1b1b1b;background:#fff}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0}caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{border:1px solid #d0d0d0;padding:.25em .6em;vertical-align:top}
th{background:#f3f3f3;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
.banner{padding:.7em 1em;margin:.8em 0;border-radius:4px;font-weight:600}
.fail{background:#fde2e1;border:1px solid #d93025;color:#8c1d18}
.warn{background:#fff4d6;border:1px solid #e0a800;color:#6b4f00}
.pass{background:#e3f5e6;border:1px solid #1e8e3e;color:#0d5223}
.ok{color:#0d5223;font-weight:600}.bad{color:#8c1d18;font-weight:600}
.note{color:#555;font-size:.9em}.plot svg{max-width:100%;height:auto}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{flex:1 1 30em}
"""


class ReportError(ValueError):
    """A file a report reads is missing, too large or not what its writer writes."""


# ------------------------------------------------------------------------------ field paths

_SAFE_KEY = re.compile(r"[A-Za-z0-9_\-]+\Z")
_TOKEN = re.compile(r'\.?([A-Za-z0-9_\-]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def field_path(*parts: str | int) -> str:
    """The dotted path of ``parts``: ``a.b[0]``; a key that is not a plain word is quoted,
    ``al_by_category["a.b"]``, so every path names one place."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _SAFE_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += "[" + orjson.dumps(part).decode() + "]"
    return out


def resolve_field(data: Any, path: str) -> Any:
    """The value at a ``field_path`` in ``data``; KeyError when there is none."""
    pos, node = 0, data
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise KeyError(f"{path!r}: cannot parse at {pos}")
        key: str | int = (
            m.group(1) if m.group(1) is not None
            else int(m.group(2)) if m.group(2) is not None
            else orjson.loads(m.group(3))
        )  # fmt: skip
        found = (isinstance(key, int) and isinstance(node, list) and key < len(node)) or (
            isinstance(key, str) and isinstance(node, dict) and key in node
        )
        if not found:
            raise KeyError(f"{path!r}: no {key!r}")
        node = node[key]
        pos = m.end()
    return node


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: int | float, digits: int | None) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if digits is None:
        digits = 1 if abs(value) >= 100 else 2 if abs(value) >= 1 else 4
    return f"{value:,.{digits}f}"


@dataclass
class Fields:
    """A JSON document, read leniently (a missing or mistyped field shows as "-"), whose
    numbers are rendered with their ``data-field`` path."""

    data: Any

    def get(self, *parts: str | int) -> Any:
        node = self.data
        for part in parts:
            if isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node):
                node = node[part]
            elif isinstance(part, str) and isinstance(node, dict):
                node = node.get(part)
            else:
                return None
        return node

    def num(self, *parts: str | int, digits: int | None = None) -> str:
        value = self.get(*parts)
        if not is_number(value):
            return "-"
        return f'<span data-field="{esc(field_path(*parts))}">{_fmt(value, digits)}</span>'

    def text(self, *parts: str | int) -> str:
        value = self.get(*parts)
        if value is None or value == [] or value == {}:
            return "-"
        if isinstance(value, list):
            return esc(", ".join(map(str, value)))
        if isinstance(value, bool):
            return "yes" if value else "no"
        if is_number(value):
            return self.num(*parts)
        return esc(value)

    def interval(self, *parts: str | int, digits: int | None = None) -> str:
        """An Interval's json as ``mean (low to high)``, or the mean alone when it has none."""
        mean = self.num(*parts, "mean", digits=digits)
        if not is_number(self.get(*parts, "low")) or not is_number(self.get(*parts, "high")):
            return mean if mean != "-" else "-"
        low = self.num(*parts, "low", digits=digits)
        high = self.num(*parts, "high", digits=digits)
        return f'{mean} <span class="note">({low} to {high})</span>'

    def items(self, *parts: str | int) -> Iterator[tuple[str, Any]]:
        node = self.get(*parts)
        if isinstance(node, dict):
            yield from list(node.items())[:MAX_TABLE_ROWS]

    def rows(self, *parts: str | int) -> Iterator[tuple[int, Any]]:
        node = self.get(*parts)
        if isinstance(node, list):
            yield from list(enumerate(node))[:MAX_TABLE_ROWS]


def check_word(check: Mapping[str, Any]) -> str:
    """A comparability check's result in one word, on a page and in the console: "pass" or
    "fail"; "stated" for one not required of the pair (``"stated": true``: its figure is shown,
    nothing rests on it, so a chi-square at p 2.5e-18 never reads "pass"); "n/a" when it did
    not run (``ok`` null)."""
    ok = check.get("ok")
    if check.get("stated") is True:
        return "stated"
    return "pass" if ok is True else "fail" if ok is False else "n/a"


# ------------------------------------------------------------------------------ the page


@dataclass
class Page:
    """An HTML document assembled from escaped parts."""

    title: str
    source: str
    parts: list[str] = field(default_factory=list)

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def heading(self, text: str, level: int = 2) -> None:
        self.add(f"<h{level}>{esc(text)}</h{level}>")

    def banner(self, kind: str, markup: str) -> None:
        self.add(f'<div class="banner {kind}" role="alert">{markup}</div>')

    def note(self, markup: str) -> None:
        self.add(f'<p class="note">{markup}</p>')

    def table(
        self,
        caption: str,
        header: Sequence[str] | None,
        rows: Iterable[Sequence[str]],
        empty: str = "nothing to show",
    ) -> None:
        """``rows`` hold markup (already escaped); cells holding a number align right. A table
        with no row is no table: its caption and why it is empty (``empty``, plain text)."""
        rows = list(rows)
        if not rows:
            self.add(f'<p class="empty"><strong>{esc(caption)}</strong>: '
                     f'<span class="note">{esc(empty)}</span></p>')  # fmt: skip
            return
        out = [f"<table><caption>{esc(caption)}</caption>"]
        if header:
            out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            cells = []
            for i, cell in enumerate(row):
                if i == 0 and not header:
                    cells.append(f"<th>{cell}</th>")
                else:
                    cls = ' class="n"' if cell.startswith("<span data-field") else ""
                    cells.append(f"<td{cls}>{cell}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table>")
        self.add("".join(out))

    def plots(self, svgs: Sequence[str]) -> None:
        if svgs:
            self.add('<div class="plots">' + "".join(svgs) + "</div>")

    def render(self) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta name="speclens-source" content="{esc(self.source)}">'
            f"<title>{esc(self.title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{esc(self.title)}</h1>" + "\n".join(self.parts) + "</body></html>\n"
        )


def plot(title: str, draw: Callable[..., str], *args: Any) -> str:
    """One plot as a figure element; a plot that cannot be drawn says why instead of failing
    the report (its data came from a server)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            svg = draw(*args)
    except (ValueError, OverflowError, FloatingPointError, RuntimeError) as exc:
        return f'<p class="note">{esc(title)}: not drawn ({esc(str(exc)[:200])})</p>'
    return f'<figure class="plot" aria-label="{esc(title)}">{svg}</figure>'


# ------------------------------------------------------------------------------ reading


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, bounded; ReportError naming the file otherwise."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise ReportError(f"{path}: not found") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_JSON_BYTES:
        raise ReportError(f"{path}: larger than {MAX_JSON_BYTES // 2**20} MiB")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def expect_field(data: Mapping[str, Any], path: Path, key: str, kind: type) -> None:
    if not isinstance(data.get(key), kind):
        what = "an object" if kind is dict else "a list" if kind is list else kind.__name__
        got = "nothing" if key not in data else type(data[key]).__name__
        raise ReportError(f"{path}: field {key}: expected {what}, got {got}")


def expect_schema(data: Mapping[str, Any], path: Path, schema: str) -> None:
    if data.get("schema") != schema:
        raise ReportError(f"{path}: field schema: expected {schema!r}, got {data.get('schema')!r}")


def write_page(directory: Path, page: Page) -> Path:
    path = directory / REPORT_NAME
    with open_new(path) as fh:
        fh.write(page.render().encode("utf-8"))
    return path
