"""report.html for a K schedule (``speclens sim --context --output-dir``, from k_schedule.json):
the deployment it was simulated on, the schedule (best K and its gain over no speculation, by
concurrency or at a target interactivity, against context length) and how far to trust its
figures (their expected error), the AL each K used and where it came from, how steps were
priced, each loss at long context with its term, the engine flags, and per context each K's
throughput per GPU against interactivity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from speclens.runs.html import (
    Fields,
    Page,
    esc,
    expect_field,
    plot,
    read_json,
    write_page,
)
from speclens.runs.rundir import is_number

SCHEDULE_NAME = "k_schedule.json"


def write_schedule_report(out_dir: Path) -> Path:
    """``out_dir/report.html`` from ``out_dir/k_schedule.json``; returns its path."""
    path = Path(out_dir) / SCHEDULE_NAME
    sched = read_json(path)
    for key in ("rows", "contexts"):
        expect_field(sched, path, key, list)
    return write_page(Path(out_dir), schedule_page(sched))


def _tokens(n: object) -> str:
    if not isinstance(n, int) or isinstance(n, bool):
        return "?"
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def schedule_page(sched: dict[str, Any]) -> Page:
    f = Fields(sched)
    page = Page("speclens sim: K schedule", SCHEDULE_NAME)
    d = ("deployment",)
    page.add('<p class="identity">' + " · ".join([
        f"model <strong>{f.text('model')}</strong>",
        f"method <strong>{f.text('method')}</strong>",
        f"chip <strong>{f.text(*d, 'hardware')}</strong>",
        f"tensor parallel <strong>{f.text(*d, 'tensor_parallel')}</strong>",
        f"GPUs <strong>{f.num('gpus')}</strong>",
        f"precision <strong>{f.text(*d, 'precision')}</strong>",
    ]) + "</p>")  # fmt: skip
    _schedule_table(page, f)
    said = f.get("trust", "line")
    page.add(f'<p class="trust">{esc(said)}</p>' if isinstance(said, str)
             else '<p class="note">expected error not recorded</p>')  # fmt: skip
    page.note("each context fixes every request's input at that many tokens (k = 1024); K 0 "
              "is no speculation; a cell is the best K by output tok/s/GPU and its gain over "
              "no speculation at the same point (tok/s/GPU / no speculation's − 1)")  # fmt: skip
    for _, row in f.rows("rows"):
        for cell in row.get("cells", []) if isinstance(row, dict) else []:
            if isinstance(cell, dict) and isinstance(cell.get("reason"), str):
                page.note(esc(cell["reason"]))
    page.heading("Where a longer context loses a K")
    losses = [esc(x.get("line")) for _, x in f.rows("losses") if isinstance(x, dict)]
    page.add("<ul>" + "".join(f"<li>{line}</li>" for line in losses) + "</ul>" if losses else
             '<p class="note">no context\'s best K is below the shortest context\'s</p>')  # fmt: skip
    _acceptance_table(page, f)
    page.heading("How steps were priced")
    priced = [esc(p.get("line")) for _, p in f.rows("pricing") if isinstance(p, dict)]
    page.add("<ul>" + "".join(f"<li>{line}</li>" for line in priced) + "</ul>" if priced else
             '<p class="note">not recorded</p>')  # fmt: skip
    lines = f.get("emit", "lines")
    if isinstance(lines, list) and lines:
        page.heading(f"Engine flags ({f.text('emit', 'engine')})")
        page.add("<pre>" + "\n".join(esc(line) for line in lines if isinstance(line, str))
                 + "</pre>")  # fmt: skip
    page.heading("Plots")
    page.plots(_plots(f))
    return page


def _schedule_table(page: Page, f: Fields) -> None:
    target = f.get("tok_s_user")
    head = "tok/s/user" if is_number(target) else "concurrency"
    contexts = [c for _, c in f.rows("contexts")]
    rows = []
    for i, row in f.rows("rows"):
        r = ("rows", i)
        first = f.num(*r, "tok_s_user") if is_number(target) else f.num(*r, "concurrency")
        cells = []
        for j, cell in enumerate(row.get("cells", []) if isinstance(row, dict) else []):
            c = (*r, "cells", j)
            k = cell.get("num_spec_tokens") if isinstance(cell, dict) else None
            if k is None:
                cells.append("-")
                continue
            text = f"K {f.num(*c, 'num_spec_tokens')}"
            if k:
                text += f" (gain {f.num(*c, 'gain', digits=3)})"
            cells.append(f"{text}<br>{f.num(*c, 'tok_s_gpu', digits=0)} tok/s/GPU")
        rows.append([first, *cells])
    caption = (f"Best K at {target:g} tok/s/user by context" if is_number(target)
               else "Best K by concurrency and context")  # fmt: skip
    page.table(caption, [head, *(f"context {_tokens(c)}" for c in contexts)], rows,
               empty="no point was simulated")  # fmt: skip


def _acceptance_table(page: Page, f: Fields) -> None:
    page.heading("The AL each K used")
    rows = []
    for i, _ in f.rows("acceptance"):
        a = ("acceptance", i)
        profile = f.get(*a, "profile")
        rows.append([f.num(*a, "num_spec_tokens"), f.num(*a, "acceptance_length", digits=4),
                     f.text(*a, "layer"),
                     f"{f.text(*a, 'profile_set')}: {f.text(*a, 'profile')}" if profile else "-",
                     f.text(*a, "source")])  # fmt: skip
    page.table("Acceptance per K", ["K", "AL", "layer", "profile", "source"], rows,
               empty="no acceptance recorded")  # fmt: skip


def _plots(f: Fields) -> list[str]:
    """Per context, each K's output tok/s/GPU against tok/s/user (1000 / TPOT p50): the curves
    the schedule picks from."""
    from speclens.runs.html_plots import Series, curve_plot

    curves: dict[Any, dict[Any, Series]] = {}
    for _, p in f.rows("points"):
        if not isinstance(p, dict):
            continue
        tpot, y, k = p.get("tpot_p50_ms"), p.get("tok_s_gpu"), p.get("num_spec_tokens")
        if not (is_number(tpot) and tpot > 0 and is_number(y)):
            continue
        name = f"K {k}" if k else "no speculation"
        s = curves.setdefault(p.get("context"), {}).setdefault(k, Series(name, [], []))
        s.x.append(1000.0 / tpot)
        s.y.append(float(y))
    svgs = []
    for c, by_k in curves.items():
        name = _tokens(c)
        svgs.append(plot(f"context {name}", curve_plot, [by_k[k] for k in sorted(by_k)],
                         "tok/s/user (1000 / TPOT p50)", "output tok/s/GPU",
                         f"Throughput per GPU against interactivity, context {name}",
                         f"schedule-{name}"))  # fmt: skip
    return svgs
