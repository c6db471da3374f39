"""A trace: the requests of a run as the simulator replays them, and as calibration reads them.

Two sources. A bench (or sim) run directory: each measured request's start, prompt and
completion tokens (and the prompt tokens the server took from its prefix cache, where it says),
and its realized acceptance (verify steps, accepted drafts, histogram, and every decode step
where the server counts them; or, as llama.cpp reports it, drafted and accepted tokens only),
with the run's loop (closed at its concurrency, or open at its arrival times), K, and the most
sequences the server decodes at once where it says. Or a Mooncake-style JSONL file, one
request per line: ``timestamp`` (milliseconds), ``input_length``, ``output_length``; open loop,
no acceptance.

Every problem is one line naming the file, the line or field, and what was expected.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson

from speclens.runs import rundir
from speclens.runs.record import MAX_SECONDS
from speclens.runs.rundir import InputError

#: Bounds on a trace file: its size, its requests, and a request's tokens (each becomes words of
#: filler for bench and decode steps of arrays for the replay).
MAX_TRACE_BYTES = 256 * 2**20
MAX_TRACE_REQUESTS = 2**20
MAX_TRACE_TOKENS = 2**20
#: The most milliseconds a trace's arrivals may span: a year, the longest time a run's records
#: hold (``speclens.runs.record.MAX_SECONDS``); past it a step's price would vanish in the clock's
#: rounding and the replay's records could not be read back.
MAX_TRACE_SPAN_MS = MAX_SECONDS * 1000.0
#: Of its summary: the settings, the server (its K and batch) and the figures.
SUMMARY_FIELDS = ("settings", "server", "figures")
#: The fields of a records.jsonl row a replay reads (``read_trace``).
TRACE_FIELDS = ("index", "success", "row_error", "warmup", "category", "start_s", "scheduled_s",
                "latency_s", "prompt_tokens", "completion_tokens", "cached_tokens",
                "spec_decode_acceptance")  # fmt: skip


class TraceError(Exception):
    """A trace that cannot be read: ``lines``, each naming the file and what was expected."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


@dataclass(frozen=True)
class TraceRequest:
    """One request to replay: when it arrived (seconds from the trace's start), its lengths, and
    the acceptance it realized (None where the trace does not say)."""

    index: int
    arrival: float
    input_tokens: int
    output_tokens: int
    category: str = "trace"
    steps: int | None = None  # verify steps
    accepted: int | None = None  # accepted drafts
    histogram: dict[int, int] | None = None  # {accepted drafts: verify steps}
    drafted: int | None = None  # draft tokens verified (where the engine counts only tokens)
    cached: int = 0  # prompt tokens the server took from its prefix cache (not computed)
    decode_steps: int | None = None  # every decode step, drafted or not, where the server counts

    def verify_steps(self, k: int) -> int | None:
        """Its verify steps: as stated, or counted from its tokens (``counted_verify_steps``);
        None when it states no acceptance."""
        if self.steps is not None or self.accepted is None or k < 1:
            return self.steps
        return counted_verify_steps(self.accepted, self.drafted, k)


def counted_verify_steps(accepted: int, drafted: int | None, k: int) -> int:
    """The verify steps of a request whose engine counts tokens only (llama.cpp's ``draft_n``
    and ``draft_n_accepted``): the fewest that verify its drafted tokens at up to K a step
    (n-gram and draft-model drafters draft K whenever they draft), and never fewer than its
    accepted drafts need."""
    return max(-(-(drafted or 0) // k), -(-accepted // k))


@dataclass
class Trace:
    source: Path
    kind: str  # "run" or "mooncake"
    requests: list[TraceRequest]
    concurrency: int | None = None  # closed loop at this concurrency; None: open loop
    k: int | None = None  # the K its acceptance was realized at
    model: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    #: The most sequences the server decodes at once, where it says (llama.cpp's slots).
    max_num_seqs: int | None = None

    @property
    def identity(self) -> str:
        """sha256 of the requests replayed (index, input and output lengths, in order): a
        replay's stand-in for the prompts digest, since the simulator sends no text."""
        digest = hashlib.sha256()
        for r in self.requests:
            digest.update(f"{r.index}\t{r.input_tokens}\t{r.output_tokens}\n".encode())
        return digest.hexdigest()

    @property
    def states_acceptance(self) -> bool:
        return any(r.steps is not None or r.accepted is not None for r in self.requests)


def read_trace(path: Path) -> Trace:
    """A run directory, or a Mooncake-style JSONL file."""
    if path.is_dir():
        return _run_trace(path)
    if path.is_file():
        return _mooncake(path)
    raise TraceError([f"{path}: not found (expected a run directory or a JSONL trace file)"])


# --- a run directory ------------------------------------------------------------------------


def _run_trace(path: Path) -> Trace:
    try:
        run = rundir.read_run(
            path, rundir.fields(TRACE_FIELDS), rundir.fields_but_acceptance(SUMMARY_FIELDS)
        )
    except InputError as exc:
        raise TraceError(exc.lines) from None
    rows = run.completed
    if not rows:
        raise TraceError([f"{path / 'records.jsonl'}: no request finished: nothing to replay"])
    settings = run.settings
    open_loop = settings.get("request_rate") is not None
    requests, problems = [], []
    for row in rows:
        where = f"{path / 'records.jsonl'}: index {row['index']}"
        if row.get("prompt_tokens") is None or not row.get("completion_tokens"):
            problems.append(f"{where}: expected prompt_tokens and completion_tokens (the server's "
                            "usage) to replay its lengths")  # fmt: skip
            continue
        lengths = [(k, why) for k in ("prompt_tokens", "completion_tokens")
                   if (why := _length_problem(row[k]))]  # fmt: skip
        if lengths:
            problems += [f"{where}: {k}: {why}" for k, why in lengths]
            continue
        if row.get("start_s") is None or row.get("latency_s") is None:
            problems.append(f"{where}: expected start_s and latency_s: a trace needs timings")
            continue
        arrival = (
            row["scheduled_s"]
            if open_loop and row.get("scheduled_s") is not None
            else row["start_s"]
        )
        requests.append(TraceRequest(
            int(row["index"]), float(arrival), int(row["prompt_tokens"]),
            int(row["completion_tokens"]), str(row.get("category") or "trace"),
            *_acceptance(row.get("spec_decode_acceptance")), int(row.get("cached_tokens") or 0),
            _decode_steps(row.get("spec_decode_acceptance")),
        ))  # fmt: skip
    if problems:
        raise TraceError(problems[:10])
    requests.sort(key=lambda r: (r.arrival, r.index))
    server = run.summary.get("server")
    seqs = server.get("max_num_seqs") if isinstance(server, dict) else None
    return Trace(path, "run", _from_zero(requests), None if open_loop else settings.get("concurrency"),
                 _k(run), settings.get("model"), settings,
                 seqs if type(seqs) is int and 1 <= seqs <= MAX_TRACE_REQUESTS else None)  # fmt: skip


def _acceptance(
    spec: dict[str, Any] | None,
) -> tuple[int | None, int | None, dict[int, int] | None, int | None]:
    """(verify steps, accepted drafts, histogram, drafted tokens) as the record states them."""
    if not spec or spec.get("num_accepted_draft_tokens") is None:
        return None, None, None, None
    drafted = spec.get("num_draft_tokens")
    drafted = int(drafted) if drafted is not None else None
    if spec.get("num_spec_steps") is None:  # counts only (llama.cpp)
        return None, int(spec["num_accepted_draft_tokens"]), None, drafted
    histogram = spec.get("acceptance_histogram")
    return (int(spec["num_spec_steps"]), int(spec["num_accepted_draft_tokens"]),
            {int(j): int(n) for j, n in histogram.items()} if histogram else None,
            drafted)  # fmt: skip


def _decode_steps(spec: dict[str, Any] | None) -> int | None:
    """Its decode steps as the server counted them (``num_decode_steps``: speclens serve and
    sim), where it states acceptance and them; else None."""
    if not spec or spec.get("num_accepted_draft_tokens") is None:
        return None
    steps = spec.get("num_decode_steps")
    return int(steps) if steps else None


def _k(run: Any) -> int | None:
    ks = run.ks()
    return int(next(iter(ks))) if len(ks) == 1 else None


def _from_zero(requests: list[TraceRequest]) -> list[TraceRequest]:
    """Arrivals counted from the first request's (the list is in arrival order)."""
    start = requests[0].arrival
    return [replace(r, arrival=r.arrival - start) for r in requests]


# --- a Mooncake-style JSONL file --------------------------------------------------------------


def _length_problem(value: object) -> str | None:
    """Why ``value`` cannot be a request's token count, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_TRACE_TOKENS:
        return None
    return f"expected a token count >= 1 and at most {MAX_TRACE_TOKENS:,}, got {value!r:.40}"


def _mooncake(path: Path) -> Trace:
    """``{"timestamp": ms, "input_length": n, "output_length": m, ...}`` per line."""
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError([f"{path}: larger than {MAX_TRACE_BYTES} bytes"])
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError([f"{path}: cannot be read: {exc.strerror or exc}"]) from None
    requests: list[TraceRequest] = []
    problems: list[str] = []
    first: float | None = None  # the first line's timestamp
    for number, line in enumerate(data.splitlines(), start=1):
        if len(problems) >= 10:
            break
        if not line.strip():
            continue
        if len(requests) >= MAX_TRACE_REQUESTS:
            problems.append(f"{path}: holds more than {MAX_TRACE_REQUESTS} requests")
            break
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            problems.append(f"{path}: line {number}: not JSON")
            continue
        if not isinstance(row, dict):
            problems.append(f"{path}: line {number}: expected an object")
            continue
        stamp = row.get("timestamp")
        if not (isinstance(stamp, int | float) and not isinstance(stamp, bool)
                and math.isfinite(stamp) and stamp >= 0):  # fmt: skip
            problems.append(f"{path}: line {number}: timestamp: expected milliseconds >= 0, "
                            f"got {stamp!r:.40}")  # fmt: skip
            continue
        first = stamp if first is None else first
        if stamp - first > MAX_TRACE_SPAN_MS:
            problems.append(f"{path}: line {number}: timestamp: expected milliseconds within "
                            f"{MAX_TRACE_SPAN_MS:.0f} (a year) of the first line's ({first!r}), "
                            f"got {stamp!r:.40}")  # fmt: skip
            continue
        bad = [(k, why) for k in ("input_length", "output_length")
               if (why := _length_problem(row.get(k)))]  # fmt: skip
        if bad:
            problems += [f"{path}: line {number}: {k}: {why}" for k, why in bad]
            continue
        requests.append(TraceRequest(len(requests), stamp / 1000.0, row["input_length"],
                                     row["output_length"]))  # fmt: skip
    if problems:
        raise TraceError(problems[:10])
    if not requests:
        raise TraceError([f"{path}: no request (expected one JSON object per line with "
                          "timestamp, input_length and output_length)"])  # fmt: skip
    if any(b.arrival < a.arrival for a, b in pairwise(requests)):
        raise TraceError([f"{path}: timestamps must not decrease (line order is arrival order)"])
    return Trace(path, "mooncake", _from_zero(requests))
