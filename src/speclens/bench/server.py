"""What the server says about itself: ``/version`` and its acceptance counters, scraped before
and after a run so the client's totals can be checked against the server's."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from speclens.acceptance import acceptance_length
from speclens.bench import transport
from speclens.bench.probe import llamacpp_props
from speclens.runs.record import MAX_POSITIONS

VLLM = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
#: vLLM's accepted drafts by draft position (label ``position``, 0-based).
VLLM_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: llama-server ``--metrics`` (``tools/server/server-task.cpp``, ``server_task_result_metrics``):
#: the same quantities under its prefix, added when a request's slot is released. ``drafts`` are
#: verify steps that had drafts; the per-position series exists once a request drafted.
LLAMACPP = {key: name.replace("vllm:", "llamacpp:") for key, name in VLLM.items()}
LLAMACPP_PER_POSITION = VLLM_PER_POSITION.replace("vllm:", "llamacpp:")
#: The Prometheus families read, each with its per-position counter and source label.
FAMILIES = (
    (VLLM, VLLM_PER_POSITION, "metrics:vllm"),
    (LLAMACPP, LLAMACPP_PER_POSITION, "metrics:llama.cpp"),
)
#: ``trtllm-serve``'s ``/metrics`` is JSON: the iteration stats queued since the last read
#: (``tensorrt_llm/serve/openai_server.py`` drains ``llm.get_stats_async``), each iteration's
#: ``specDecodingStats`` with ``numDraftTokens``, ``numAcceptedTokens`` and
#: ``numRequestsWithDraftTokens`` (one verify step per request that drafted that iteration).
TRTLLM_SOURCE = "metrics:trtllm-iteration-stats"


def parse_metrics(text: str, model: str | None = None) -> dict[str, Any] | None:
    """vLLM's counters, or ATOM's names, from Prometheus text; None when neither is there.

    Samples are summed over their labels (vLLM's ``engine``), and vLLM's per-position counter
    becomes ``accepted_per_position`` {position: count}. With ``model``, and when some sample is
    labelled ``model_name="<model>"``, only the samples of that model (or with no ``model_name``)
    count: one server may serve several models, and the run loaded one of them."""
    if text.lstrip()[:1] in ("[", "{"):  # JSON, not Prometheus text
        return parse_iteration_stats(text)
    families = list(text_string_to_metric_families(text))
    named = {
        s.labels["model_name"] for f in families for s in f.samples if "model_name" in s.labels
    }
    only = model if model is not None and model in named else None
    sums: dict[str, float] = {}
    per_position: dict[str, dict[int, float]] = {}
    for family in families:
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if only is not None and sample.labels.get("model_name", only) != only:
                continue
            name = sample.name.removesuffix("_total")  # exporters differ on where _total goes
            sums[name] = sums.get(name, 0.0) + sample.value
            position = sample.labels.get("position", "")
            digits = len(position) <= 4 and position.isascii() and position.isdigit()
            if digits and int(position) < MAX_POSITIONS:
                p = int(position)
                row = per_position.setdefault(name, {})
                row[p] = row.get(p, 0.0) + sample.value
    for names, positional, source in FAMILIES:
        if all(name in sums for name in names.values()):
            out: dict[str, Any] = {key: sums[name] for key, name in names.items()}
            if per_position.get(positional):
                out["accepted_per_position"] = per_position[positional]
            return out | {"source": source}
    if "atom:mtp_decode_steps" in sums and "atom:mtp_accepted_tokens" in sums:
        return {
            "drafts": sums["atom:mtp_decode_steps"],
            "draft_tokens": sums.get("atom:mtp_draft_tokens", float("nan")),
            "accepted_tokens": sums["atom:mtp_accepted_tokens"],
            "source": "metrics:atom",
        }
    return None


def parse_iteration_stats(text: str) -> dict[str, Any] | None:
    """TensorRT-LLM's JSON iteration stats, summed: the increments since the previous read
    (``drained``), not running totals. None when it is not a list of objects or no iteration
    carries ``specDecodingStats``; an iteration whose stats are not counts is skipped."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, list):
        return None
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    seen = skipped = 0
    for item in data:
        spec = item.get("specDecodingStats") if isinstance(item, dict) else None
        if not isinstance(spec, dict):
            continue
        values = [spec.get(key) for key in _TRTLLM_KEYS.values()]
        if not all(type(v) is int and v >= 0 for v in values):
            skipped += 1
            continue
        seen += 1
        for key, value in zip(_TRTLLM_KEYS, values, strict=True):
            totals[key] += float(value)  # type: ignore[arg-type]
    if data and not seen and not skipped:
        return None  # iterations without speculative decoding (an empty list is "none since")
    out: dict[str, Any] = {**totals, "source": TRTLLM_SOURCE, "drained": True, "iterations": seen}
    if skipped:
        out["skipped_iterations"] = skipped
    return out


_TRTLLM_KEYS = {
    "drafts": "numRequestsWithDraftTokens",
    "draft_tokens": "numDraftTokens",
    "accepted_tokens": "numAcceptedTokens",
}


#: The most of a /metrics, /debug/mtp_stats or /version body read; a larger one is not used.
MAX_BODY = 8 * 1024 * 1024


class Unreachable(Exception):
    """The server could not be reached at all (refused, reset, timed out)."""


class GaugeOnly(Exception):
    """The server reports acceptance only as gauges (SGLang's ``sglang:spec_accept_length`` and
    ``sglang:spec_accept_rate``, ``python/sglang/srt/metrics/collector.py``): a gauge is the
    latest value, not a running total, so no delta over the run can be taken."""


#: Acceptance gauges that mean "this server reports acceptance, but not as counters".
ACCEPTANCE_GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate")


def acceptance_gauges(text: str) -> list[str]:
    """The ``ACCEPTANCE_GAUGES`` present in a Prometheus text (by name, at the start of a line)."""
    lines = text.splitlines()
    return [g for g in ACCEPTANCE_GAUGES if any(line.startswith(g) for line in lines)]


async def _get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, bytes]:
    """Status and body (status -1 for a body over ``MAX_BODY`` decoded bytes, or one that cannot
    be decoded); raises ``Unreachable`` when the request failed on the way, so callers can tell a
    dead server from a missing endpoint. The body is decoded as the client's are (bounded
    slices, ``transport.read_at_most``), never by aiohttp."""
    try:
        async with session.get(url, headers=headers, allow_redirects=False) as resp:
            try:
                body, over = await transport.read_at_most(resp, MAX_BODY)
            except transport.BodyError:
                return -1, b""
            return (-1, b"") if over else (resp.status, body)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise Unreachable(f"{type(exc).__name__}: {exc}") from None


async def read_counters(
    base_url: str, api_key: str | None = None, model: str | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """The server's acceptance counters (/metrics first, then /debug/mtp_stats), or None and
    why: a dead server and one that exposes no counters call for different conclusions.
    ``model`` keeps vLLM's counters to that served model (see ``parse_metrics``)."""
    try:
        counters = await _scrape(base_url, api_key, model)
    except Unreachable as exc:
        return None, f"server unreachable ({exc})"
    except GaugeOnly as exc:
        return None, f"the server exposes gauges only ({exc}): no delta possible"
    if counters is None:
        return None, "the server exposes no acceptance counters"
    return counters, None


async def scrape(
    base_url: str, api_key: str | None = None, model: str | None = None
) -> dict[str, Any] | None:
    """The server's acceptance counters, or None when they cannot be read."""
    return (await read_counters(base_url, api_key, model))[0]


async def _scrape(base_url: str, api_key: str | None, model: str | None) -> dict[str, Any] | None:
    base = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with transport.session(10) as session:
        status, body = await _get(session, base + "/metrics", headers)
        gauges: list[str] = []
        if status == 200:
            text = body.decode("utf-8", errors="replace")
            try:
                parsed = parse_metrics(text, model)
            except ValueError:
                parsed = None
            if parsed is not None:
                return parsed
            gauges = acceptance_gauges(text)
        status, body = await _get(session, base + "/debug/mtp_stats", headers)
        if status == 200:
            try:
                stats = orjson.loads(body)
                return {
                    "drafts": float(sum(stats["distribution"].values())),
                    "draft_tokens": float(stats["total_draft_tokens"]),
                    "accepted_tokens": float(stats["total_accepted_tokens"]),
                    "source": "debug/mtp_stats",
                }
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
                pass
    if gauges:
        raise GaugeOnly(", ".join(gauges))
    return None


async def server_info(base_url: str, api_key: str | None = None) -> dict[str, Any] | None:
    """The server's ``/version`` (speclens and vLLM report one); else what llama.cpp's
    ``/props`` says of it (``llamacpp_info``); else None."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with transport.session(10) as session:
            status, body = await _get(session, base_url.rstrip("/") + "/version", headers)
            if status != 200:
                status, body = await _get(session, base_url.rstrip("/") + "/props", headers)
                return llamacpp_info(body) if status == 200 else None
    except Unreachable:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else {"version": data}


def llamacpp_info(body: bytes) -> dict[str, Any] | None:
    """llama-server's ``GET /props`` as a server block: its build, and its slots
    (``total_slots``, the most sequences it decodes at once: a replay runs no more), or None
    for a body of another shape (``probe.llamacpp_props``, as ``--backend auto`` knows it)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not llamacpp_props(data):
        return None
    slots = data.get("total_slots")
    build = data.get("build_info")
    return {"engine": "llama.cpp", "version": build if isinstance(build, str) else None,
            "max_num_seqs": slots if type(slots) is int and slots >= 1 else None}  # fmt: skip


def served_speculation(info: dict[str, Any] | None) -> dict[str, Any]:
    """``/version``'s acceptance block, type-checked: ``method`` (a string), K (an integer >= 1)
    and ``forced``; a field of the wrong type reads as absent rather than failing later."""
    block = info.get("acceptance") if isinstance(info, dict) else None
    block = block if isinstance(block, dict) else {}
    method, k = block.get("method"), block.get("num_speculative_tokens")
    return {
        "method": method if isinstance(method, str) and method else None,
        "num_speculative_tokens": k if type(k) is int and k >= 1 else None,
        "forced": bool(block.get("forced")),
    }


def cross_check(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    client: dict[str, Any],
    why_before: str | None = None,
    why_after: str | None = None,
) -> dict[str, Any]:
    """The server's counters gained over the run against the client's per-request totals.

    ``why_before``/``why_after`` say why a scrape came back empty (see ``read_counters``);
    ``unreadable_after`` marks counters that were there before the run and gone after it.
    """
    if before is None:
        note = why_before or "the server exposes no acceptance counters"
        if why_before and why_before.startswith("server unreachable"):
            note = f"the scrape before the run failed: {why_before}"
        return {"available": False, "unreadable_after": False, "note": note}
    if after is None:
        why = why_after or "no counters"
        return {
            "available": False,
            "unreadable_after": True,
            "note": f"the scrape after the run failed: {why}",
        }
    keys = ("drafts", "draft_tokens", "accepted_tokens")
    # A drained source (TensorRT-LLM) reports what happened since the previous read: the scrape
    # before the run emptied it, so the one after it is the run's.
    delta = {k: after[k] if after.get("drained") else after[k] - before[k] for k in keys}
    mine = {
        "drafts": client["verify_steps"],
        "draft_tokens": client["draft_tokens"],
        "accepted_tokens": client["accepted_tokens"],
    }
    counts_only = int(client.get("counts_only_requests") or 0)
    flags = []
    for key, value in delta.items():
        if value != value:  # NaN: not reported
            continue
        if key == "drafts" and counts_only:
            continue  # those requests carried no verify steps to compare
        if value > mine[key]:
            flags.append(
                f"server counted {value - mine[key]:g} more {key} than the client's requests carried: traffic the client did not send"
            )
        elif value < mine[key]:
            flags.append(
                f"server counted {mine[key] - value:g} fewer {key} than the client's requests report"
            )
    out = {
        "available": True,
        "unreadable_after": False,
        "source": after.get("source"),
        "server_delta": delta,
        "client_totals": mine,
        "server_al": (
            acceptance_length(delta["accepted_tokens"], delta["drafts"])
            if delta["drafts"]
            else None
        ),
        "consistent": not flags,
        "flags": flags,
    }
    if counts_only:
        out["note"] = (
            f"{counts_only} requests carried counts only: verify steps compared with the "
            "server's are not known; AL from the server's counters"
        )
    if after.get("drained"):
        out["drained"] = True
        drained_note = (
            "TensorRT-LLM's iteration stats are drained on read and its queue is bounded "
            "(iter_stats_max_iterations): a run longer than the queue loses iterations"
        )
        out["note"] = f"{out['note']}; {drained_note}" if "note" in out else drained_note
    per_position = None if counts_only else _per_position(before, after, client, delta["drafts"])
    if per_position is not None:
        out["per_position"] = per_position
        if per_position["server_accepted"] != per_position["client_accepted"]:
            flags.append(
                f"server's accepted drafts by position {per_position['server_accepted']} differ "
                f"from the client's requests' {per_position['client_accepted']}"
            )
            out["consistent"] = False
    return out


def _per_position(
    before: dict[str, Any], after: dict[str, Any], client: dict[str, Any], drafts: float
) -> dict[str, Any] | None:
    """Accepted drafts by position over the run, server's and client's, and the rates each gives
    (accepted at position i over verify steps: vLLM's per-position acceptance rate)."""
    if "accepted_per_position" not in after or "accepted_per_position" not in before:
        return None
    gained = {
        p: n - before["accepted_per_position"].get(p, 0.0)
        for p, n in after["accepted_per_position"].items()
    }
    mine = list(client.get("accepted_per_position") or [])
    k = max(len(mine), max(gained, default=-1) + 1)
    server = [gained.get(p, 0.0) for p in range(k)]
    mine += [0] * (k - len(mine))
    steps = client["verify_steps"]
    return {
        "server_accepted": server,
        "client_accepted": mine,
        "server_rates": [n / drafts for n in server] if drafts else None,
        "client_rates": [n / steps for n in mine] if steps else None,
    }
