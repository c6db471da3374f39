"""``speclens bench`` scaled out: worker processes, several replicas, shards and their merge.

Everything runs on loopback against real servers: ``speclens serve --executor sim`` where the
server's counters are compared, the canned server (``canned_server.py``) where only the load
shape matters.

Arrival statistics with workers use the bands of ``test_arrivals.py``: for gaps drawn from a
gamma of shape k and mean 1/R over n gaps, the sample mean has standard error (1/R)/sqrt(k n)
and the sample CV sqrt((k + 1) / (2 k^2 n)); each must fall within 4 standard errors (a
two-sided false-alarm rate of 6e-5 each). Workers deal one schedule between them, so the merged
stream is the single-process stream for the same seed; that is checked exactly as well.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from canned_server import running_canned

from serverkit import FORCED, ServerProcess, free_port, mtp_stats, running_servers
from speclens.bench.client import LoadConfig, LoadGenerator, RequestRecord
from speclens.bench.datasets import random_prompts
from speclens.bench.run import run_bench
from speclens.bench.workers import worker_parts

pytestmark = pytest.mark.integration

RATE = 300.0
ARRIVALS = 601
BAND_SE = 4.0


@pytest.fixture(scope="module")
def canned() -> Iterator[str]:
    with running_canned(free_port()) as url:
        yield url


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """Two forced-acceptance replicas with per-request stats."""
    args = [*FORCED, "--executor", "sim", "--per-request-spec-decode-stats", "summary"]
    with running_servers(tmp_path_factory.mktemp("scale-out"), args, args) as servers:
        yield servers


def _steps(stats: dict[str, Any]) -> tuple[int, int]:
    return sum(stats["distribution"].values()), stats["total_accepted_tokens"]


def test_workers_record_every_request_once_and_match_the_servers_counters(
    sims: list[ServerProcess],
) -> None:
    server = sims[0]
    seen: list[RequestRecord] = []
    config = LoadConfig(
        url=server.url, model="dummy", num_requests=40, concurrency=8, max_tokens=24,
        ignore_eos=True, warmup=4,
    )  # fmt: skip
    before = _steps(mtp_stats(server.url))
    outcome = asyncio.run(
        run_bench(config, random_prompts(40, 8, 24, seed=0), on_done=seen.append, workers=2)
    )
    after = _steps(mtp_stats(server.url))
    records = outcome.records
    assert sorted(r.index for r in records) == list(range(44))  # 4 warm-up, 40 measured
    assert sorted(r.index for r in seen) == list(range(44))  # each streamed once
    assert all(r.success for r in records), [r.error for r in records if not r.success][:3]
    figures = outcome.summary["figures"]
    assert figures["requests"]["completed"] == 40 and figures["requests"]["warmup"] == 4
    acc = figures["acceptance"]
    # The scrape ran once, after every worker's warm-up: the measured part alone is in the delta.
    check = outcome.summary["server_check"]
    assert check["available"] and check["consistent"], check
    assert acc["requests_with_stats"] == 40
    warm_steps = sum(r.spec["num_spec_steps"] for r in records if r.warmup and r.spec)
    assert acc["verify_steps"] + warm_steps == after[0] - before[0]
    assert outcome.exit_code == 0


def _schedule(config: LoadConfig, count: int) -> list[float]:
    generator = LoadGenerator(config, random_prompts(4, 2, 1, seed=0))
    return [due for _, _, due in generator._arrivals(count, False, False, 0)]


@pytest.mark.parametrize(("shape", "seed"), [(1.0, 0), (0.5, 1)], ids=["poisson", "gamma-0.5"])
def test_two_workers_merge_into_the_asked_arrival_process(
    canned: str, shape: float, seed: int
) -> None:
    config = LoadConfig(
        url=canned, model="canned", num_requests=ARRIVALS, concurrency=None, request_rate=RATE,
        burstiness=shape, max_tokens=1, seed=seed,
    )  # fmt: skip
    outcome = asyncio.run(run_bench(config, random_prompts(ARRIVALS, 2, 1, seed=0), workers=2))
    records = sorted(outcome.records, key=lambda r: r.index)
    assert [r.index for r in records] == list(range(ARRIVALS))
    assert all(r.success for r in records)
    # Exactly the stream one process draws for this seed, dealt between the workers.
    due = np.array([r.scheduled for r in records], dtype=float)
    assert due.tolist() == _schedule(config, ARRIVALS)
    assert all(r.start >= r.scheduled - 1e-3 for r in records)  # type: ignore[operator]
    n = ARRIVALS - 1
    sent = np.diff(sorted(r.start for r in records))
    mean_se = (1 / RATE) / math.sqrt(shape * n)
    assert abs(sent.mean() - 1 / RATE) <= BAND_SE * mean_se, (sent.mean(), mean_se)
    gaps = np.diff(due)
    cv = float(gaps.std(ddof=1) / gaps.mean())
    cv_se = math.sqrt((shape + 1) / (2 * shape**2 * n))
    assert abs(cv - 1 / math.sqrt(shape)) <= BAND_SE * cv_se, (cv, cv_se)


def test_round_robin_spreads_requests_and_reports_each_replica(sims: list[ServerProcess]) -> None:
    urls = tuple(s.url for s in sims)
    before = [_steps(mtp_stats(u)) for u in urls]
    config = LoadConfig(
        url=urls[0], urls=urls, model="dummy", num_requests=20, concurrency=4, max_tokens=16,
        ignore_eos=True,
    )  # fmt: skip
    outcome = asyncio.run(run_bench(config, random_prompts(20, 8, 16, seed=1)))
    after = [_steps(mtp_stats(u)) for u in urls]
    replicas = outcome.summary["replicas"]
    assert list(replicas) == list(urls)
    for i, url in enumerate(urls):
        mine = [r for r in outcome.records if r.replica == url]
        assert sorted(r.index for r in mine) == list(range(i, 20, 2))  # by index, alternately
        figures = replicas[url]["figures"]
        assert figures["requests"]["completed"] == 10
        acc = figures["acceptance"]
        assert (acc["verify_steps"], acc["accepted_tokens"]) == (
            after[i][0] - before[i][0],
            after[i][1] - before[i][1],
        )
        check = replicas[url]["server_check"]
        assert check["available"] and check["consistent"], check
    assert outcome.summary["server_check"]["consistent"]
    total = outcome.summary["figures"]["acceptance"]["verify_steps"]
    assert total == sum(r["figures"]["acceptance"]["verify_steps"] for r in replicas.values())


def test_a_replica_that_counts_other_traffic_is_flagged_by_name(sims: list[ServerProcess]) -> None:
    """The per-replica check can fail: traffic sent to one replica behind the client's back is
    named with that replica's URL."""
    urls = tuple(s.url for s in sims)
    config = LoadConfig(
        url=urls[0], urls=urls, model="dummy", num_requests=8, concurrency=2, max_tokens=16,
        ignore_eos=True, routing="least-outstanding",
    )  # fmt: skip
    generator_done: list[RequestRecord] = []

    def sneak(record: RequestRecord) -> None:
        generator_done.append(record)
        if len(generator_done) == 1:  # one request the client never sees, to replica 2
            import httpx

            body = {"model": "dummy", "prompt": "x", "max_tokens": 16, "ignore_eos": True}
            httpx.post(urls[1] + "/v1/completions", json=body, timeout=30)

    outcome = asyncio.run(run_bench(config, random_prompts(8, 8, 16, seed=2), on_done=sneak))
    per = outcome.summary["replicas"]
    assert {r.replica for r in outcome.records} == set(urls)  # least-outstanding used both
    assert per[urls[0]]["server_check"]["consistent"]
    assert not per[urls[1]]["server_check"]["consistent"]
    flags = outcome.summary["server_check"]["flags"]
    assert flags and all(f.startswith(urls[1] + ": ") for f in flags), flags


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["index"], row["category"], row["warmup"], row["success"], row["completion_tokens"])


def test_shards_merge_into_the_unsharded_run(canned: str, tmp_path: Path, run_cli: Any) -> None:
    common = ["--url", canned, "--model", "canned", "--num-requests", "13", "--warmup", "2",
              "--max-tokens", "1", "--concurrency", "4"]  # fmt: skip
    code, _, err = run_cli("bench", *common, "--output-dir", tmp_path / "whole")
    assert code == 0, err
    for i in range(3):
        code, _, err = run_cli(
            "bench", *common, "--shard", f"{i}/3", "--output-dir", tmp_path / f"s{i}"
        )
        assert code == 0, err
    shard_rows = [_rows(tmp_path / f"s{i}" / "records.jsonl") for i in range(3)]
    assert [len(r) for r in shard_rows] == [5, 5, 5]  # 15 requests dealt by index modulo 3
    assert {r["index"] % 3 for r in shard_rows[1]} == {1}
    code, out, err = run_cli(
        "bench", "merge", *(tmp_path / f"s{i}" for i in range(3)), "--output-dir", tmp_path / "m"
    )
    assert code == 0, err + out
    whole = sorted(map(_key, _rows(tmp_path / "whole" / "records.jsonl")))
    merged = sorted(map(_key, _rows(tmp_path / "m" / "records.jsonl")))
    assert merged == whole and len(merged) == 15
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    expected = json.loads((tmp_path / "whole" / "summary.json").read_text())
    for key in ("sent", "completed", "failed", "warmup"):
        assert summary["figures"]["requests"][key] == expected["figures"]["requests"][key]
    tokens = summary["figures"]["throughput"]["total_output_tokens"]
    assert tokens == expected["figures"]["throughput"]["total_output_tokens"]
    assert summary["settings"]["shards"] == 3


def test_merge_refuses_what_is_not_one_run(canned: str, tmp_path: Path, run_cli: Any) -> None:
    common = ["--url", canned, "--model", "canned", "--num-requests", "4", "--concurrency", "2"]
    for name, extra in (("a", ["--shard", "0/2", "--max-tokens", "1"]),
                        ("b", ["--shard", "1/2", "--max-tokens", "2"]),
                        ("c", ["--shard", "0/2", "--max-tokens", "2"])):  # fmt: skip
        code, _, err = run_cli("bench", *common, *extra, "--output-dir", tmp_path / name)
        assert code == 0, err
    code, _, err = run_cli("bench", "merge", tmp_path / "a", tmp_path / "b", "--output-dir", tmp_path / "m")  # fmt: skip
    assert code == 1
    assert "summary.json: settings.max_tokens: 2 differs from 1" in err, err
    code, _, err = run_cli("bench", "merge", tmp_path / "c", "--output-dir", tmp_path / "m")
    assert code == 1 and "shards [1] of 2 are missing" in err, err
    code, _, err = run_cli("bench", "merge", tmp_path / "c", tmp_path / "c", tmp_path / "b", "--output-dir", tmp_path / "m")  # fmt: skip
    assert code == 1 and "settings.shard: shard 0 is also" in err, err
    code, _, err = run_cli("bench", "merge", tmp_path / "c", tmp_path / "b", "--output-dir", tmp_path / "m")  # fmt: skip
    assert code == 0, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "command line: --workers: expected an integer in [1, 256], got 0"),
        (["--shard", "2/2"], "command line: --shard: expected I/N with 0 <= I < N, got '2/2'"),
        (["--workers", "3", "--concurrency", "2"], "command line: --concurrency: expected at least one request per worker and shard (3), got 2"),
        (["--url", "http://127.0.0.1:1", "--url", "http://127.0.0.1:1"], "command line: --url: a replica is given twice"),
    ],
)  # fmt: skip
def test_scale_out_usage_errors(run_cli: Any, args: list[str], message: str) -> None:
    code, _, err = run_cli("bench", "--model", "m", *args)
    assert code == 2 and message in err, err


def test_duration_with_workers_stops_sending_at_the_deadline(canned: str) -> None:
    config = LoadConfig(
        url=canned, model="canned", num_requests=None, duration=1.0, concurrency=4, max_tokens=1
    )
    outcome = asyncio.run(run_bench(config, random_prompts(16, 2, 1, seed=0), workers=2))
    records = outcome.records
    assert records and max(r.start for r in records) < 1.0 + 0.01, max(r.start for r in records)
    assert sorted(r.index for r in records) == sorted({r.index for r in records})
    load = outcome.summary["load"]
    assert 0.9 <= load["sending_s"] < 1.5 and load["in_flight_at_stop"] <= 4
    assert outcome.exit_code == 0


def test_ctrl_c_with_workers_exits_130_and_keeps_every_finished_record(
    canned: str, tmp_path: Path
) -> None:
    """SIGINT to the whole process group, as a terminal sends it: the workers ignore it, the
    parent stops them, and every finished request is in records.jsonl once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "speclens", "bench", "--url", canned, "--model", "canned",
         "--duration", "120", "--concurrency", "4", "--max-tokens", "1",
         "--workers", "2", "--output-dir", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        records = out / "records.jsonl"
        deadline = time.monotonic() + 60
        while not (records.exists() and records.stat().st_size > 10_000):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 130, proc.stderr.read()  # type: ignore[union-attr]
    rows = _rows(out / "records.jsonl")
    indices = [r["index"] for r in rows]
    assert rows and len(indices) == len(set(indices))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["figures"]["interrupted"]
    assert summary["figures"]["requests"]["sent"] == len(rows)


def test_the_cli_reports_each_replica(canned: str, tmp_path: Path, run_cli: Any) -> None:
    with running_canned(free_port()) as other:
        code, out, err = run_cli(
            "bench", "--url", canned, "--url", other, "--model", "canned", "--num-requests", "6",
            "--max-tokens", "1", "--concurrency", "2", "--output-dir", tmp_path,
        )  # fmt: skip
    assert code == 0, err
    assert "Replicas" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {u: r["figures"]["requests"]["completed"] for u, r in summary["replicas"].items()} == {
        canned: 3,
        other: 3,
    }
    assert {r["replica"] for r in _rows(tmp_path / "records.jsonl")} == {canned, other}


def test_worker_parts_of_a_shard_interleave_within_the_shard() -> None:
    """Kills the mutation: ``workers.worker_parts`` giving worker w part p * W + w instead of
    p + P * w (of shard p/P), which sends other shards' requests."""
    config = LoadConfig(url="http://127.0.0.1:1", model="m", part=(1, 2))
    assert [c.part for c in worker_parts(config, 3)] == [(1, 6), (3, 6), (5, 6)]
    for p, parts, workers in ((0, 3, 2), (2, 3, 4), (0, 1, 3)):
        mine = worker_parts(replace(config, part=(p, parts)), workers)
        owned = sorted(j for c in mine for j in range(60) if j % c.part[1] == c.part[0])
        assert owned == [j for j in range(60) if j % parts == p]


def test_a_shard_with_workers_sends_exactly_its_own_requests(canned: str) -> None:
    """Kills the mutation: ``workers.worker_parts`` interleaving p * W + w instead of p + P * w,
    end to end: shard 1/2 of 2 warm-up and 10 measured requests with 2 workers."""
    config = LoadConfig(
        url=canned, model="canned", num_requests=10, warmup=2, concurrency=2, max_tokens=1,
        part=(1, 2),
    )  # fmt: skip
    outcome = asyncio.run(run_bench(config, random_prompts(12, 2, 1, seed=0), workers=2))
    assert sorted(r.index for r in outcome.records) == [1, 3, 5, 7, 9, 11]
    assert [r.index for r in outcome.records if r.warmup] == [1]
    assert all(r.success for r in outcome.records)
