"""The K schedule: best K by batch size (or at a target interactivity) and context length.

``speclens sim --context 1k,8k,32k`` runs the K x concurrency grid once per context length, K 0
(no speculation) included as the baseline. ``k`` is 1024 tokens. Each context fixes every
request's input length at that many tokens (the scenario's spread is dropped, so a column reads
the context it names); everything else is the scenario's.

A cell is the best K at that batch size (concurrency) and context, by output tok/s/GPU, with its
gain over no speculation at the same point; with ``--at-interactivity`` the one row is each
context's decision (``speclens.sim.decide``). Where a context's best K is below the shortest
context's, the step-time difference between the two Ks is split into the roofline's terms
(``Roofline.terms``: verify width, KV reads, the drafter) at both contexts, and the term whose
difference grows most is named: it is what makes the longer K lose.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speclens.acceptance import emit

#: Tokens in a ``k`` of ``--context`` (``1k`` is 1024 tokens).
CONTEXT_UNIT = 1024
#: Most context lengths in one ``--context``.
MAX_CONTEXTS = 8
#: Most simulated points in one schedule: contexts x (K values + K 0) x concurrencies.
MAX_SCHEDULE_POINTS = 256
#: Engines ``--emit`` writes K flags for: those ``profiles resolve --emit`` knows.
ENGINES = emit.ENGINES

TERMS = {"verify_width": "verify width", "kv_reads": "KV reads", "drafter": "the drafter"}


def parse_contexts(text: str) -> list[int]:
    """``1k,8k,32k`` or ``1024,8192``: distinct token counts >= 1, in order; ``ValueError``
    names what is wrong."""
    values: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        scale = CONTEXT_UNIT if part.lower().endswith("k") else 1
        digits = part[:-1] if scale != 1 else part
        if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
            raise ValueError(f"expected token counts like 1k,8k,32k or 1024,8192, got {part!r}")
        values.append(int(digits) * scale)
    if not values:
        raise ValueError(f"expected token counts like 1k,8k,32k, got {text!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"a context length is given twice in {text!r}")
    if len(values) > MAX_CONTEXTS:
        raise ValueError(f"{len(values)} context lengths, over the limit of {MAX_CONTEXTS}")
    return sorted(values)


def with_context(scenario: Any, context: int) -> Any:
    """The scenario with every request's input fixed at ``context`` tokens."""
    workload = scenario.workload.model_copy(update={"input_tokens": context})
    return scenario.model_copy(update={"workload": workload})


def at_concurrency(scenario: Any, concurrency: int) -> Any:
    """The scenario with each pool's ``max_num_seqs`` at most ``concurrency``: a closed loop
    of that many requests never holds more, so results are the same, and the fast path's
    KV bound (which counts ``max_num_seqs`` of the longest request) then covers long contexts
    at small batches."""
    pools = [
        p.model_copy(update={"engine": p.engine.model_copy(
            update={"max_num_seqs": min(p.engine.max_num_seqs, concurrency)})})
        for p in scenario.deployment.pools
    ]  # fmt: skip
    deployment = scenario.deployment.model_copy(update={"pools": pools})
    return scenario.model_copy(update={"deployment": deployment})


def without_speculation(scenario: Any) -> Any:
    """The scenario with no pool speculating (K 0's baseline: no drafter weights or steps)."""
    pools = [
        p.model_copy(update={"engine": p.engine.model_copy(update={"speculative": None})})
        for p in scenario.deployment.pools
    ]
    deployment = scenario.deployment.model_copy(update={"pools": pools})
    return scenario.model_copy(update={"deployment": deployment})


def tokens(n: int) -> str:
    """``32k`` for 32768, else the count."""
    return f"{n // CONTEXT_UNIT}k" if n % CONTEXT_UNIT == 0 else str(n)


def _tpot_point(row: dict[str, Any], gpus: int) -> tuple[float, float]:
    return row["throughput"]["output_tokens_per_s"] / gpus, (
        (row["latency_ms"].get("tpot") or {}).get("mean") or 0.0
    )


def _cell(k: int, value: float | None, base: float | None) -> dict[str, Any]:
    gain = value / base - 1 if value is not None and base else None
    return {"num_spec_tokens": k, "tok_s_gpu": value, "gain": gain}


def schedule(
    points: Sequence[tuple[int, int, int, dict[str, Any]]],
    gpus: int,
    target: float | None = None,
) -> dict[str, Any]:
    """The schedule over (context, K, concurrency, ``speclens sim`` row) points, K 0 the
    baseline: ``rows`` (one per concurrency, or one at ``target`` tok/s/user), each with a
    cell per context."""
    from speclens.sim.decide import decide

    contexts = sorted({c for c, _, _, _ in points})
    concurrencies = sorted({n for _, _, n, _ in points})
    rows: list[dict[str, Any]] = []
    if target is None:
        for n in concurrencies:
            cells = []
            for c in contexts:
                by_k = {k: _tpot_point(r, gpus)[0] for cc, k, nn, r in points if (cc, nn) == (c, n)}
                best = max(sorted(by_k), key=lambda k: by_k[k])
                cells.append({"context": c, **_cell(best, by_k[best], by_k.get(0))})
            rows.append({"concurrency": n, "cells": cells})
    else:
        cells = []
        for c in contexts:
            d = decide([(k, r) for cc, k, _, r in points if cc == c], target, gpus)
            base = next((e["tok_s_gpu"] for e in d["ks"] if e["num_spec_tokens"] == 0), None)
            cell = _cell(d["best"], d["best_tok_s_gpu"], base) if d["best"] is not None else {
                "num_spec_tokens": None, "tok_s_gpu": None, "gain": None,
                "reason": f"at {tokens(c)} context, {d['headline'].partition(', ')[2]}"}  # fmt: skip
            cells.append({"context": c, **cell})
        rows.append({"tok_s_user": target, "cells": cells})
    return {
        "context_unit": CONTEXT_UNIT,
        "contexts": contexts,
        "tok_s_user": target,
        "gpus": gpus,
        "input_tokens": "fixed at each context length",
        "rows": rows,
    }


def attribute(sched: dict[str, Any], roof: Any, fallback_batch: int) -> list[dict[str, Any]]:
    """For each row and context whose best K is below the shortest context's: the roofline's
    terms of a decode step of both Ks at both contexts, and the term whose difference (the
    shorter context's K minus the new best K) grows most from the shortest context."""
    found = []
    for row in sched["rows"]:
        first = row["cells"][0]
        ks = first["num_spec_tokens"]
        batch = row.get("concurrency") or fallback_batch
        for cell in row["cells"][1:]:
            kl = cell["num_spec_tokens"]
            if ks is None or kl is None or kl >= ks:
                continue

            def gap(
                context: int, ks: int = ks, kl: int = kl, batch: int = batch
            ) -> dict[str, float]:
                hi = roof.terms(batch * (ks + 1), batch, batch * context, batch, ks)
                lo = roof.terms(batch * (kl + 1), batch, batch * context, batch, kl)
                return {t: hi[t] - lo[t] for t in TERMS}

            short, long = gap(first["context"]), gap(cell["context"])
            growth = {t: long[t] - short[t] for t in TERMS}
            term = max(growth, key=lambda t: growth[t])
            found.append({
                "concurrency": row.get("concurrency"), "tok_s_user": row.get("tok_s_user"),
                "batch": batch, "context": cell["context"], "from_k": ks, "to_k": kl,
                "growth_s": growth, "term": term,
                "line": f"at {tokens(cell['context'])} context"
                + (f", concurrency {row['concurrency']}" if row.get("concurrency") else "")
                + f", K {ks} loses to {_k(kl)}: {TERMS[term]} grows most (K {ks}'s step costs "
                f"{growth[term] * 1e3:+.2f} ms more against {_k(kl)} than at "
                f"{tokens(first['context'])}, a batch of {batch})",
            })  # fmt: skip
    return found


def _k(k: int) -> str:
    return f"K {k}" if k else "no speculation"


def cell_text(cell: dict[str, Any]) -> str:
    """``K 4 +37%``, ``K 0`` (no speculation wins) or ``-`` (no K reaches the target)."""
    k = cell["num_spec_tokens"]
    if k is None:
        return "-"
    if k == 0:
        return "K 0"
    return f"K {k} {cell['gain']:+.0%}" if cell["gain"] is not None else f"K {k}"


def flags(engine: str, method: str, k: int) -> str:
    """What ``engine`` takes to serve K ``k`` with ``method`` (K 0: no speculative flags):
    ``speclens.acceptance.emit.serving``, the rules ``profiles resolve --emit`` follows, so a
    method an engine cannot take is refused (``EmitRefused``) here as it is there."""
    return emit.serving(engine, method, k).line


def batch_ranges(sched: dict[str, Any], index: int) -> list[list[int]]:
    """Context ``index``'s K by batch size as vLLM's ``num_speculative_tokens_per_batch_size``
    entries, ``[first, last, K]`` inclusive: each concurrency row covers the batch sizes above
    the previous row's, up to its own; neighbours with the same K merge."""
    ranges: list[list[int]] = []
    low = 1
    for row in sched["rows"]:
        k = row["cells"][index]["num_spec_tokens"]
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = row["concurrency"]
        else:
            ranges.append([low, row["concurrency"], k])
        low = row["concurrency"] + 1
    return ranges


def _vllm_dynamic(sched: dict[str, Any], method: str) -> list[str]:
    """vLLM's dynamic K (``vllm/config/speculative.py``, ``num_speculative_tokens_per_batch_size``:
    inclusive ``(first, last, K)`` batch-size ranges, K 0 allowed, ``num_speculative_tokens``
    the largest; ``vllm/v1/spec_decode/dynamic/utils.py``): one line per distinct setting,
    naming the contexts it serves; more than one only where contexts differ, since vLLM has no
    context axis (vLLM RFC #48627 proposes one)."""
    by_line: dict[str, list[str]] = {}
    for i, c in enumerate(sched["contexts"]):
        ranges = batch_ranges(sched, i)
        top = max(r[2] for r in ranges)
        if top == 0:
            line = flags("vllm", method, 0)
        else:
            config: dict[str, object] = {"method": method, "num_speculative_tokens": top}
            if len({r[2] for r in ranges}) > 1:
                config["num_speculative_tokens_per_batch_size"] = ranges
            line = emit.vllm_config(config)
        by_line.setdefault(line, []).append(tokens(c))
    lines = [f"vllm: {line}  # {', '.join(where)}" for line, where in by_line.items()]
    if len(by_line) > 1:
        lines.insert(0, "vllm picks K by batch size, not by context: one server per context "
                        "length (routed by prompt length)")  # fmt: skip
    return lines


def emit_lines(sched: dict[str, Any], engine: str, method: str) -> list[str]:
    """One line per distinct K of the schedule, naming where it wins (an engine serves one K
    a server), then what else the engine needs for the method (``note: ...``)."""
    where: dict[int, dict[int, list[str]]] = {}
    for row in sched["rows"]:
        head = str(row["concurrency"]) if row.get("concurrency") else (
            f"{row['tok_s_user']:g} tok/s/user")  # fmt: skip
        for cell in row["cells"]:
            k = cell["num_spec_tokens"]
            if k is not None:
                where.setdefault(k, {}).setdefault(cell["context"], []).append(head)
    by = "concurrency " if sched["tok_s_user"] is None else ""
    w = {k: [f"{tokens(c)}: {by}{', '.join(heads)}" for c, heads in sorted(ctx.items())]
         for k, ctx in where.items()}  # fmt: skip
    notes = [*dict.fromkeys(n for k in where if k for n in emit.serving(engine, method, k).notes)]
    if engine == "vllm" and sched["tok_s_user"] is None:
        return _vllm_dynamic(sched, method) + [f"note: {n}" for n in notes]
    lines = [f"{engine}: {flags(engine, method, k)}  # {'; '.join(w[k])}" for k in sorted(w)]
    if len(where) > 1:
        lines.insert(0, f"{engine} serves one K a server: the schedule wants {len(where)} "
                        "(one server per line, routed by batch size and context)")  # fmt: skip
    return lines + [f"note: {n}" for n in notes]
