"""``speclens serve --tensor-parallel-size 2`` under hostile conditions: sizes the model or the
machine cannot take and a rank that cannot start are refused in one line (exit 1); no rank
outlives Ctrl-C, SIGTERM or a SIGKILL of rank 0; a rank that dies while serving fails the
request in flight and stops the server; the forced run's /debug/mtp_stats distribution at TP 2
is TP 1's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import launch
from serverkit import (
    AL,
    K,
    ServerProcess,
    child_env,
    free_port,
    mtp_stats,
    post,
    post_in_background,
    running_servers,
    serve_command,
    wait_until,
)
from speclens.engine.parallel import FAIL_RANK_ENV

FORCED_NGRAM = ["--method", "ngram", "--num-speculative-tokens", str(K),
                "--spec-decode-acceptance-length", str(AL), "--seed", "5"]  # fmt: skip
CORES = len(os.sched_getaffinity(0))
PROMPTS = ["the cat sat on the mat. the cat sat on", "abcabcabcabc"]


def rank_pids(parent: int) -> list[int]:
    """The tensor-parallel rank processes whose parent is ``parent`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"follower_main" in command:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def refused(args: list[str], env: dict[str, str] | None = None) -> str:
    """Run a serve that must refuse; its stderr, whitespace folded."""
    done = launch.run(
        serve_command(args, free_port()), timeout=120, env={**child_env(), **(env or {})}
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    return " ".join(done.stderr.split())


def tp_server(tmp_path: Path, *args: str) -> ServerProcess:
    server = ServerProcess(["-tp", "2", *args], tmp_path).start()
    server.wait_ready()
    return server


@pytest.mark.skipif(CORES < 2, reason="TP 2 needs two cores")
def test_sizes_the_model_or_machine_cannot_take_are_refused() -> None:
    text = refused(["--tensor-parallel-size", "8"])  # the dummy target has 4 KV heads
    assert "refused: --tensor-parallel-size 8: --model dummy has 4 key/value heads" in text
    if CORES < 4:
        text = refused(["-tp", str(CORES + 1)])
        assert f"gives the process {CORES} CPU core(s), expected at most one rank" in text
    text = refused(["-tp", "0"])
    assert "--tensor-parallel-size: expected an integer from 1 to 64, got 0" in text


@pytest.mark.skipif(CORES < 2, reason="TP 2 needs two cores")
def test_a_rank_that_cannot_start_is_refused_and_stopped() -> None:
    text = refused(["-tp", "2"], {FAIL_RANK_ENV: "1"})
    assert "refused: --tensor-parallel-size 2: rank 1 failed to start: RuntimeError:" in text


@pytest.mark.skipif(CORES < 2, reason="TP 2 needs two cores")
def test_forced_tp2_distribution_equals_tp1_and_ctrl_c_leaves_no_rank(tmp_path: Path) -> None:
    with running_servers(tmp_path, FORCED_NGRAM, ["-tp", "2", *FORCED_NGRAM]) as (one, two):
        ranks = rank_pids(two.pid)
        assert len(ranks) == 1
        for prompt in PROMPTS:  # one at a time, the same requests on both
            body = {"model": "dummy", "prompt": prompt, "max_tokens": 32, "temperature": 0}
            answers = [post(s.url + "/v1/completions", body) for s in (one, two)]
            assert [a.status_code for a in answers] == [200, 200]
            texts = [a.json()["choices"][0]["text"] for a in answers]
            assert texts[0] == texts[1]
        stats = [mtp_stats(s.url) for s in (one, two)]
        assert stats[1]["distribution"] == stats[0]["distribution"]
        assert set(stats[1]["distribution"]) == {"2", "3"}
        two.send_signal(signal.SIGINT)
        assert two.wait(timeout=30) == 0
        assert wait_until(lambda: not any(alive(p) for p in ranks), timeout=10)


@pytest.mark.skipif(CORES < 2, reason="TP 2 needs two cores")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_no_rank_outlives_rank_0(tmp_path: Path, sig: signal.Signals) -> None:
    server = tp_server(tmp_path)
    try:
        ranks = rank_pids(server.pid)
        assert len(ranks) == 1
        server.send_signal(sig)
        server.wait(timeout=30)
        assert wait_until(lambda: not any(alive(p) for p in ranks), timeout=10), server.log()
    finally:
        server.stop()


@pytest.mark.skipif(CORES < 2, reason="TP 2 needs two cores")
def test_a_rank_dying_fails_the_request_and_stops_the_server(tmp_path: Path) -> None:
    server = tp_server(tmp_path)
    try:
        (rank,) = rank_pids(server.pid)
        body = {"model": "dummy", "prompt": "x", "max_tokens": 1500, "ignore_eos": True}
        thread, answer = post_in_background(server.url + "/v1/completions", body)
        time.sleep(1.0)
        os.kill(rank, signal.SIGKILL)
        thread.join(timeout=60)
        assert answer and not (isinstance(answer[0], httpx.Response) and answer[0].is_success)
        assert server.wait(timeout=30) == 1
        assert "tensor-parallel rank 1 exited with code -9" in server.log()
    finally:
        server.stop()


def test_rank_pids_reads_this_process_children() -> None:
    """The /proc reader finds a child by its command line (and nothing else)."""
    code = "import time; time.sleep(30)  # follower_main"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert wait_until(lambda: rank_pids(os.getpid()) == [child.pid], timeout=10)
    finally:
        child.kill()
        child.wait()
