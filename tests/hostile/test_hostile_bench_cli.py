"""``speclens bench`` (and ``measure``) under bad options and failing servers: every option is
checked before the first request (exit 2, one line), a run whose requests failed never passes
(exit 3), a dead server is told apart from one without counters, and records.jsonl is streamed
so a killed server or Ctrl-C loses nothing that finished."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import launch
from serverkit import FORCED, ServerProcess, child_env, free_port, running_server, wait_until

#: A slow forced server: 50 ms a step, so a 2000-request run lasts far longer than any test.
SLOW = [*FORCED, "--executor", "sim", "--per-request-spec-decode-stats", "summary",
        "--step-cost", '{"base": 0.05}', "--max-num-seqs", "8"]  # fmt: skip


class Stub:
    """An aiohttp server in a thread: every completion gets ``status``; counts what it got."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.port = free_port()
        self.requests = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _completion(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.Response(status=self.status, text="boom")

    async def _version(self, request: web.Request) -> web.Response:
        acceptance = {"method": "ngram", "num_speculative_tokens": 3, "forced": False}
        return web.json_response({"version": "0", "hardware": "cpu", "acceptance": acceptance})

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_get("/version", self._version)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> Stub:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def stub500() -> Iterator[Stub]:
    with Stub(500) as stub:
        yield stub


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("hostile-bench"), *SLOW) as server:
        yield server


def nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"


def bench_popen(*args: str | Path, out: Path) -> launch.Child | subprocess.Popen[bytes]:
    """``speclens bench`` in a subprocess (same interpreter and PYTHONPATH), output to files."""
    command = [sys.executable, "-m", "speclens", "bench", *map(str, args)]
    with (out / "stdout").open("wb") as so, (out / "stderr").open("wb") as se:
        return launch.popen(command, stdout=so, stderr=se, env=child_env())


def rows(path: Path) -> list[dict[str, Any]]:
    """The file's complete lines: one still being written (no newline yet) is not a row."""
    if not path.exists():
        return []
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


# ---------------------------------------------------------------------------- options: exit 2


BAD_OPTIONS = [
    (["--concurrency", "-3"], "--concurrency: expected an integer >= 1, got -3"),
    (["--concurrency", "0"], "--concurrency: expected an integer >= 1, got 0"),
    (["--request-rate", "-1"], "--request-rate: expected a number > 0, got -1"),
    (["--request-rate", "0"], "--request-rate: expected a number > 0, got 0"),
    (["--request-rate", "2", "--burstiness", "0"], "--burstiness: expected a number > 0, got 0"),
    (["--burstiness", "-1"], "--burstiness: expected a number > 0, got -1"),
    (["--max-tokens", "0"], "--max-tokens: expected an integer >= 1, got 0"),
    (["--max-tokens", "-5"], "--max-tokens: expected an integer >= 1, got -5"),
    (["--timeout", "0"], "--timeout: expected a number > 0, got 0"),
    (["--timeout", "-1"], "--timeout: expected a number > 0, got -1"),
    (["--num-requests", "0"], "--num-requests: expected an integer >= 1, got 0"),
    (["--num-requests", "-2"], "--num-requests: expected an integer >= 1, got -2"),
    (["--duration", "0"], "--duration: expected a number > 0, got 0"),
    (["--duration", "-1"], "--duration: expected a number > 0, got -1"),
    (["--warmup", "-1"], "--warmup: expected an integer >= 0, got -1"),
    (["--input-len", "0"], "--input-len: expected an integer >= 1, got 0"),
    (["--seed", "-1"], "--seed: expected an integer >= 0, got -1"),
    (["--max-failure-rate", "1.5"], "--max-failure-rate: expected a number in [0, 1], got 1.5"),
    (["--expect-acceptance-length", "0"],
     "--expect-acceptance-length: expected a number >= 1, got 0"),
    (["--expect-acceptance-length", "nan"],
     "--expect-acceptance-length: expected a number >= 1, got nan"),
    (["--expect-acceptance-length", "9", "--num-spec-tokens", "3"],
     "--expect-acceptance-length: expected a number in [1, 4], got 9"),
    # issue 19 item 15: K = 10**9 was a MemoryError traceback; one bound, MAX_NUM_SPEC_TOKENS
    (["--num-spec-tokens", "1000000000", "--expect-acceptance-length", "2"],
     "--num-spec-tokens: expected an integer in [1, 64], got 1000000000"),
    (["--num-spec-tokens", "65"], "--num-spec-tokens: expected an integer in [1, 64], got 65"),
]  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"), BAD_OPTIONS, ids=["_".join(a) for a, _ in BAD_OPTIONS]
)
def test_bad_option_exits_2_with_one_line_before_any_request(
    run_cli: Any, stub500: Stub, args: list[str], message: str
) -> None:
    sized = [] if {"--num-requests", "--duration"} & set(args) else ["--num-requests", "3"]
    code, _, stderr = run_cli("bench", "--url", stub500.url, "--model", "m", *sized, *args)
    assert (code, stderr.strip().splitlines()) == (2, [f"command line: {message}"])
    assert stub500.requests == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("url", "why"),
    [("notaurl", ""), ("http://[::1", " (Invalid IPv6 URL)"), ("ftp://host", ""),
     ("http://", ""), ("http://127.0.0.1:99999", " (Port out of range 0-65535)")],
)  # fmt: skip
def test_garbage_url_is_an_option_error(run_cli: Any, url: str, why: str) -> None:
    code, _, stderr = run_cli("bench", "--url", url, "--model", "m", "--num-requests", "2")
    expected = f"command line: --url: expected http(s)://HOST[:PORT], got {url!r}{why}"
    assert (code, stderr.strip().splitlines()) == (2, [expected])


@pytest.mark.timeout(60)
def test_unwritable_output_dir_exits_2_before_any_request(
    run_cli: Any, stub500: Stub, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "run"
    code, _, stderr = run_cli(
        "bench", "--url", stub500.url, "--model", "m", "--num-requests", "3", "--output-dir", out
    )
    expected = f"command line: --output-dir: cannot write to {str(out)!r}: Not a directory"
    assert (code, stderr.strip().splitlines()) == (2, [expected])
    assert stub500.requests == 0


# ---------------------------------------------------------------------------- failed runs: exit 3


@pytest.mark.timeout(60)
def test_nothing_listening_exits_3_and_never_passes(run_cli: Any) -> None:
    """With the preflight skipped, the run itself fails (the preflight's own line is tested in
    test_hostile_preflight.py)."""
    code, stdout, _ = run_cli(
        "bench", "--url", nowhere(), "--model", "m", "--num-requests", "5", "--no-preflight"
    )  # fmt: skip
    assert code == 3
    assert "run FAIL: 5 of 5 requests failed (max 0%)" in stdout
    code, stdout, _ = run_cli(
        "bench", "--url", nowhere(), "--model", "m", "--num-requests", "5",
        "--expect-acceptance-length", "3.78", "--num-spec-tokens", "7", "--no-preflight",
    )  # fmt: skip
    assert code == 3
    assert "verification PASS" not in stdout
    assert "verification FAIL: 5 of 5 requests failed (max 0%)" in stdout
    assert "ClientConnectorError" in stdout  # the first distinct error is shown


@pytest.mark.timeout(60)
def test_all_http_500_exits_3_and_shows_the_error(run_cli: Any, stub500: Stub) -> None:
    code, stdout, _ = run_cli("bench", "--url", stub500.url, "--model", "m", "--num-requests", "6")
    assert code == 3
    assert "error (x6): HTTP 500: boom" in stdout
    assert stub500.requests == 6


@pytest.mark.timeout(60)
def test_max_failure_rate_1_lets_a_failing_run_exit_0(run_cli: Any, stub500: Stub) -> None:
    code, stdout, _ = run_cli(
        "bench", "--url", stub500.url, "--model", "m", "--num-requests", "4",
        "--max-failure-rate", "1.0",
    )  # fmt: skip
    assert code == 0, stdout
    assert "4 failed" in stdout


@pytest.mark.timeout(120)
@pytest.mark.integration
def test_wrong_model_is_refused_before_the_run_or_fails_it(
    run_cli: Any, slow_server: ServerProcess, tmp_path: Path
) -> None:
    code, stdout, err = run_cli(
        "bench", "--url", slow_server.url, "--model", "no-such-model", "--num-requests", "4",
        "--expect-acceptance-length", "3.78", "--output-dir", tmp_path / "run",
    )  # fmt: skip
    assert code == 1 and stdout == ""
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith(
        f"bench: --model: {slow_server.url} does not serve 'no-such-model'; it serves "
    )
    assert not (tmp_path / "run").exists()
    code, stdout, _ = run_cli(
        "bench", "--url", slow_server.url, "--model", "no-such-model", "--num-requests", "4",
        "--expect-acceptance-length", "3.78", "--no-preflight",
    )  # fmt: skip
    assert code == 3
    assert "verification FAIL: 4 of 4 requests failed (max 0%)" in stdout
    assert "HTTP 400" in stdout


@pytest.mark.timeout(60)
def test_measure_writes_no_profile_set_from_a_failed_run(
    run_cli: Any, stub500: Stub, tmp_path: Path
) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question_id": 1, "category": "coding", "turns": ["hi"]}) + "\n")
    out = tmp_path / "reg" / "x.yaml"
    code, _, stderr = run_cli(
        "measure", "--url", stub500.url, "--model", "m", "--dataset-path", data,
        "--endpoint", "completions", "-o", out,
    )  # fmt: skip
    assert code == 3
    assert stderr.splitlines()[0] == (
        f"measure: 1 of 1 requests failed (max 0%): no profile set written to {out}"
    )
    assert not out.exists()


# ---------------------------------------------------------------------------- faults mid-run


@pytest.mark.timeout(180)
@pytest.mark.integration
def test_server_killed_mid_run_keeps_records_and_never_passes(tmp_path: Path) -> None:
    with running_server(tmp_path / "logs", *SLOW) as server:
        out = tmp_path / "run"
        out.mkdir()
        proc = bench_popen(
            "--url", server.url, "--model", "dummy", "--num-requests", "2000",
            "--concurrency", "8", "--max-tokens", "64", "--ignore-eos",
            "--expect-acceptance-length", "3.78", "--output-dir", out, out=tmp_path,
        )  # fmt: skip
        try:
            streamed = wait_until(lambda: len(rows(out / "records.jsonl")) >= 8, timeout=60)
            server.proc.kill()  # type: ignore[union-attr]
            code = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
    stdout = (tmp_path / "stdout").read_text()
    assert streamed, "records.jsonl was not written while the run went on"
    assert code == 3, stdout + (tmp_path / "stderr").read_text()
    assert "verification PASS" not in stdout
    assert "verification FAIL: " in stdout and "requests failed (max 0%)" in stdout
    summary = json.loads((out / "summary.json").read_text())
    records = rows(out / "records.jsonl")
    assert len(records) == summary["figures"]["requests"]["sent"] == 2000
    completed = summary["figures"]["requests"]["completed"]
    assert 8 <= completed < 2000
    assert sum(r["success"] for r in records) == completed
    note = summary["server_check"]["note"]
    assert note.startswith("the scrape after the run failed: server unreachable"), note
    assert "no acceptance counters" not in stdout


@pytest.mark.timeout(180)
@pytest.mark.integration
def test_ctrl_c_keeps_every_finished_request(slow_server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    proc = bench_popen(
        "--url", slow_server.url, "--model", "dummy", "--num-requests", "2000",
        "--concurrency", "8", "--max-tokens", "32", "--ignore-eos", "--output-dir", out,
        out=tmp_path,
    )  # fmt: skip
    try:
        streamed = wait_until(lambda: len(rows(out / "records.jsonl")) >= 8, timeout=60)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert streamed, "records.jsonl was not written while the run went on"
    assert code == 130, (tmp_path / "stdout").read_text() + (tmp_path / "stderr").read_text()
    assert time.monotonic() - started < 30
    summary = json.loads((out / "summary.json").read_text())
    assert summary["figures"]["interrupted"]
    records = rows(out / "records.jsonl")
    completed = summary["figures"]["requests"]["completed"]
    assert completed >= 8
    assert sum(r["success"] for r in records) == completed
    assert len(records) == summary["figures"]["requests"]["sent"]


@pytest.mark.timeout(60)
def test_garbage_payloads_and_counters_never_abort_the_report(run_cli: Any, tmp_path: Path) -> None:
    from garbage_server import GarbageServer, Reply, sse

    chunks = sse({"choices": "oops"}, "not json", {"usage": {"completion_tokens": "x"}})
    get = {
        "/version": Reply(body=b'{"acceptance": ["not", "a", "dict"]}'),
        "/metrics": Reply(body=b"vllm:spec_decode_num_drafts{ nonsense"),
        "/debug/mtp_stats": Reply(body=b'{"distribution": 5}'),
    }
    out = tmp_path / "run"
    with GarbageServer(Reply(chunks=chunks), get=get) as server:
        code, stdout, stderr = run_cli(
            "bench", "--url", server.url, "--model", "m", "--num-requests", "4",
            "--expect-acceptance-length", "3", "--num-spec-tokens", "7", "--output-dir", out,
        )  # fmt: skip
    assert code == 3, stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert "verification FAIL: 4 of 4 requests failed (max 0%)" in stdout
    assert len(rows(out / "records.jsonl")) == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["server_check"]["note"] == "the server exposes no acceptance counters"
