"""How fast the benchmark client can drive a server, against a bare aiohttp loop.

Starts a server in a subprocess, then sends the same load (streamed requests of ``--tokens``
tokens at concurrency ``--concurrency``) with:

- a bare aiohttp loop that only reads the lines (the ceiling any Python client can reach here);
- ``speclens bench``'s load generator: full SSE parsing, per-chunk timestamps, usage-based token
  counts, adapter detection, every record and raw payload kept;
- the same generator split over ``--workers`` processes (``speclens bench --workers N``);
- AIPerf, when the ``aiperf`` command is installed (same server, same load).

All four run in interleaved rounds (``--rounds``: bare, 1 process, workers, AIPerf, then again)
and the medians are printed with every round's figures, so a shared machine's load drifts into
all of them alike.

It prints the sustained request rate of each, as a ratio against the bare loop, and the client's
CPU time per streamed token. Servers:

- ``standin`` (default): a minimal aiohttp server that streams fixed chunks carrying usage and
  per-request stats, so the client, not the server, is the bottleneck;
- ``serve``: ``speclens serve --executor sim`` with a zero step cost.

    python benchmarks/client.py [--server standin|serve] [--requests 2000] [--concurrency 64]
                                [--workers 2] [--rounds 3] [--aiperf PATH/TO/aiperf]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from speclens.bench.client import LoadConfig, LoadGenerator, RunResult
from speclens.bench.datasets import random_prompts
from speclens.bench.workers import WorkerPool

STANDIN = r"""
import sys, orjson
from aiohttp import web
TOKENS = int(sys.argv[2])

async def completions(request):
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    base = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": body["model"]}
    for i in range(TOKENS):
        chunk = dict(base, choices=[{"index": 0, "text": "x", "finish_reason": None}],
                     usage={"prompt_tokens": 8, "completion_tokens": i + 1, "total_tokens": 9 + i})
        if i == TOKENS - 1:
            chunk["choices"][0]["finish_reason"] = "length"
            chunk["choices"][0]["speculative_decoding_stats"] = {
                "mean_acceptance_length": 4.0, "draft_acceptance_rate": 3 / 7,
                "acceptance_histogram": {"3": (TOKENS - 1) // 4}, "num_accepted_draft_tokens": 3 * ((TOKENS - 1) // 4),
                "num_draft_tokens": 7 * ((TOKENS - 1) // 4), "num_spec_steps": (TOKENS - 1) // 4, "num_spec_tokens": 7}
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp

app = web.Application()
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(kind: str, port: int, tokens: int) -> subprocess.Popen[bytes]:
    if kind == "standin":
        cmd = [sys.executable, "-c", STANDIN, str(port), str(tokens)]
    else:
        zero = json.dumps(
            {
                k: 0.0
                for k in (
                    "base",
                    "per_token",
                    "per_seq",
                    "per_context_token",
                    "draft_base",
                    "draft_per_token",
                )
            }
        )
        cmd = [
            sys.executable, "-m", "speclens", "serve", "--executor", "sim", "--method", "draft_model",
            "--num-speculative-tokens", "3", "--spec-decode-acceptance-length", "4",
            "--per-request-spec-decode-stats", "summary", "--max-num-seqs", "256",
            "--step-cost", zero, "--port", str(port),
        ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


async def bare_loop(url: str, requests: int, concurrency: int, tokens: int) -> float:
    """Requests/s of a loop that posts and reads lines, nothing else."""
    body = {
        "model": "dummy",
        "prompt": "hi",
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
    }
    limit = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def one() -> None:
            async with limit, session.post(url + "/v1/completions", json=body) as resp:
                async for _line in resp.content:
                    pass

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        return requests / (time.perf_counter() - start)


async def ours(
    url: str, requests: int, concurrency: int, tokens: int, workers: int = 1
) -> tuple[float, float, int]:
    """(requests/s, client CPU seconds per token, requests with stats) for speclens's client,
    over the measured part (first send to last finish; worker start-up excluded). CPU is this
    process's alone (with workers, the parent's)."""
    config = LoadConfig(url=url, model="dummy", num_requests=requests, concurrency=concurrency,
                        max_tokens=tokens, ignore_eos=True)  # fmt: skip
    prompts = random_prompts(64, 8, tokens, seed=0)
    runner = WorkerPool(config, prompts, workers) if workers > 1 else LoadGenerator(config, prompts)
    cpu = time.process_time()
    result: RunResult = await runner.run()
    cpu = time.process_time() - cpu
    done = [r for r in result.records if r.success]
    streamed = sum(r.completion_tokens or 0 for r in done)
    assert len(done) == requests, [r.error for r in result.records if not r.success][:3]
    return requests / result.duration, cpu / max(streamed, 1), sum(1 for r in done if r.spec)


def find_aiperf(exe: str | None) -> str | None:
    """The aiperf command to run: ``--aiperf`` if given (it must exist), else ``aiperf`` on PATH,
    else None (AIPerf is then reported as not installed)."""
    if exe is None:
        return shutil.which("aiperf")
    found = shutil.which(exe)
    if found is None:
        raise ValueError(f"--aiperf: {exe!r} is not an executable command; expected aiperf's path")
    return found


def aiperf(
    url: str, requests: int, concurrency: int, tokens: int, exe: str, tokenizer: Path
) -> float | None:
    """Requests/s of one AIPerf run of the same load, or None when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [
            exe, "profile", "--model", "dummy", "--url", url, "--endpoint-type", "completions",
            "--streaming", "--concurrency", str(concurrency), "--request-count", str(requests),
            "--output-tokens-mean", str(tokens), "--extra-inputs", "ignore_eos:true",
            "--artifact-dir", str(out), "--ui-type", "none", "--tokenizer", str(tokenizer),
            "--use-server-token-count",
        ]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(f"aiperf failed (exit {proc.returncode}): {proc.stderr[-500:]}", file=sys.stderr)
            return None
        rate = aiperf_throughput(out)
        if rate is None:
            print("aiperf: no request_throughput in its export; using requests / wall time "
                  "(its start-up included)", file=sys.stderr)  # fmt: skip
            return requests / wall
        return rate


def aiperf_throughput(out: Path) -> float | None:
    """The ``request_throughput.avg`` of AIPerf's JSON export under ``out``, if any."""
    for path in out.rglob("*aiperf*.json"):
        try:
            data = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        entry = data.get("request_throughput") if isinstance(data, dict) else None
        if isinstance(entry, dict) and entry.get("avg"):
            return float(entry["avg"])
    return None


@dataclass
class Rounds:
    """Per-round requests/s of each client, in the order they ran (None: AIPerf failed)."""

    bare: list[float] = field(default_factory=list)
    ours: list[float] = field(default_factory=list)
    workers: list[float] = field(default_factory=list)
    peer: list[float | None] = field(default_factory=list)
    cpu_per_token: list[float] = field(default_factory=list)
    with_stats: int = 0


def run_rounds(url: str, args: argparse.Namespace, exe: str | None, tokenizer: Path) -> Rounds:
    """Every client once per round, in turn (bare, 1 process, workers, AIPerf), so load drift
    reaches all of them alike."""
    n, c, t = args.requests, args.concurrency, args.tokens
    rounds = Rounds()
    asyncio.run(bare_loop(url, 200, c, t))  # warm up
    for _ in range(args.rounds):
        rounds.bare.append(asyncio.run(bare_loop(url, n, c, t)))
        rate, cpu_per_token, rounds.with_stats = asyncio.run(ours(url, n, c, t))
        rounds.ours.append(rate)
        rounds.cpu_per_token.append(cpu_per_token)
        rounds.workers.append(asyncio.run(ours(url, n, c, t, args.workers))[0])
        if exe is not None:
            rounds.peer.append(aiperf(url, n, c, t, exe, tokenizer))
    return rounds


def fmt(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.0f}"


def report(rounds: Rounds, args: argparse.Namespace, installed: bool) -> None:
    """Medians over rounds, ratios of the medians, and every round's figures."""
    base, rate, many = (statistics.median(v) for v in (rounds.bare, rounds.ours, rounds.workers))
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}; server {args.server}, {args.requests} streamed "
          f"{args.tokens}-token requests at concurrency {args.concurrency}; medians of "
          f"{args.rounds} interleaved rounds")  # fmt: skip
    print("| client | requests/s | ratio to bare loop |")
    print("|---|---:|---:|")
    print(f"| bare aiohttp loop (reads lines only) | {base:,.0f} | 1.00 |")
    print(f"| speclens bench, 1 process (full parsing, records kept; {rounds.with_stats} with "
          f"stats) | {rate:,.0f} | {rate / base:.2f} |")  # fmt: skip
    print(f"| speclens bench --workers {args.workers} | {many:,.0f} | {many / base:.2f} |")
    ratio = aiperf_rows(rounds, args.rounds, base, installed)
    if ratio:
        print(f"\n{ratio}")
    print(f"\n--workers {args.workers} / 1 process: {many / rate:.2f}")
    peer_rounds = rounds.peer if installed else [None] * args.rounds
    rows = zip(rounds.bare, rounds.ours, rounds.workers, peer_rounds, strict=True)
    print("rounds (bare, 1 process, workers, AIPerf): " + "; ".join(
        " ".join(fmt(v) for v in row) for row in rows))  # fmt: skip
    cpu = statistics.median(rounds.cpu_per_token)
    print(f"client CPU per streamed token (1 process): {cpu * 1e6:.1f} µs")


def aiperf_rows(rounds: Rounds, count: int, base: float, installed: bool) -> str:
    """Print AIPerf's table row; return the speclens / AIPerf line ('' without AIPerf figures).

    The ratio is of medians over the rounds AIPerf completed, so both sides cover the same
    rounds."""
    paired = [(r, p) for r, p in zip(rounds.ours, rounds.peer, strict=True) if p is not None]
    if not installed or not paired:
        print(f"| AIPerf | {'not installed' if not installed else 'failed in every round'} | - |")
        return ""
    peer = statistics.median(p for _, p in paired)
    counted = "" if len(paired) == count else f" ({len(paired)} of {count} rounds)"
    print(f"| AIPerf{counted} | {peer:,.0f} | {peer / base:.2f} |")
    ours_paired = statistics.median(r for r, _ in paired)
    per_round = [r / p for r, p in paired]
    return (
        f"speclens / AIPerf: {ours_paired / peer:.2f} (medians over the {len(paired)} of {count} "
        f"rounds AIPerf completed; per round {min(per_round):.2f}-{max(per_round):.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", choices=("standin", "serve"), default="standin")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="processes for the scaled-out run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument(
        "--aiperf", default=None, help="the aiperf command, run once per round (default: on PATH)"
    )
    args = parser.parse_args()
    for name in ("requests", "concurrency", "tokens", "workers", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected an integer >= 1, got {getattr(args, name)}")
    try:
        exe = find_aiperf(args.aiperf)
    except ValueError as err:
        parser.error(str(err))
    port = free_port()
    server = start_server(args.server, port, args.tokens)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            from speclens.engine.tokenizer import ByteTokenizer

            tokenizer = Path(tmp) / "tokenizer"
            ByteTokenizer(320).save(tokenizer)  # AIPerf needs a local tokenizer offline
            rounds = run_rounds(f"http://127.0.0.1:{port}", args, exe, tokenizer)
    finally:
        server.terminate()
        server.wait(timeout=15)
    report(rounds, args, installed=exe is not None)


if __name__ == "__main__":
    main()
