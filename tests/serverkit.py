"""Helpers for the server tests: real ``speclens serve`` processes and small HTTP readers.

Every server here is the real command (``python -m speclens serve ...``) in a subprocess, bound to
127.0.0.1 on a free port, polled on ``GET /health`` until it answers 200, and always stopped
(SIGTERM, wait, SIGKILL when it does not go). Its stdout and stderr go to files so a test can read
the log (the schedule line, the profile's provenance, tracebacks).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import launch

#: The forced-acceptance flags most tests use: K = 7 draft positions at a mean length of 3.78,
#: which resolves to the per-position rates [1, 1, 0.78, 0, 0, 0, 0].
K = 7
AL = 3.78
FORCED = [
    "--method",
    "draft_model",
    "--num-speculative-tokens",
    str(K),
    "--spec-decode-acceptance-length",
    str(AL),
]
SCHEDULE_LINE = (
    "Forced speculative acceptance ON: mean acceptance length 3.7800 over 7 draft positions "
    "(per-position rates [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]). Throughput numbers from this run "
    "are synthetic; output text and accuracy are meaningless."
)
STARTUP_TIMEOUT_S = 60.0
_counter = itertools.count()


def free_port() -> int:
    """A port nothing listens on right now (bind to port 0 and read what the kernel picked)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(args: Sequence[str], port: int) -> list[str]:
    return [sys.executable, "-m", "speclens", "serve", *args, "--port", str(port)]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # two cores shared by several servers and the tests
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class ServerProcess:
    """One ``speclens serve`` subprocess; ``url`` is its base URL (no trailing slash)."""

    args: list[str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    proc: launch.Child | subprocess.Popen[bytes] | None = None
    returncode: int | None = None

    def __post_init__(self) -> None:
        n = next(_counter)
        self.stdout_path = self.log_dir / f"server{n}-{self.port}.out"
        self.stderr_path = self.log_dir / f"server{n}-{self.port}.err"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServerProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = launch.popen(
                serve_command(self.args, self.port), stdout=out, stderr=err, env=child_env()
            )
        return self

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def log(self) -> str:
        """Everything the process wrote (its logging goes to stderr)."""
        return self.stdout() + self.stderr()

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"speclens serve {' '.join(self.args)} exited with {code} before becoming "
                    f"healthy:\n{self.log()[-4000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(
            f"speclens serve {' '.join(self.args)} not healthy after {timeout:.0f} s:\n"
            f"{self.log()[-4000:]}"
        )

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        self.returncode = self.proc.wait(timeout=timeout)
        return self.returncode

    def stop(self) -> int | None:
        """SIGTERM, wait, SIGKILL on timeout. Safe to call twice."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.returncode = self.proc.returncode
        return self.returncode


@contextlib.contextmanager
def running_servers(log_dir: Path, *arg_lists: Sequence[str]) -> Iterator[list[ServerProcess]]:
    """Start several servers at once (their start-ups overlap), wait for all, stop all."""
    servers = [ServerProcess(list(args), log_dir) for args in arg_lists]
    try:
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def running_server(log_dir: Path, *args: str) -> Iterator[ServerProcess]:
    with running_servers(log_dir, args) as (server,):
        yield server


# ---------------------------------------------------------------------------- client helpers


def post(url: str, body: Any, **kw: Any) -> httpx.Response:
    if isinstance(body, bytes | str):
        kw.setdefault("headers", {"content-type": "application/json"})
        return httpx.post(url, content=body, timeout=kw.pop("timeout", 60.0), **kw)
    return httpx.post(url, json=body, timeout=kw.pop("timeout", 60.0), **kw)


def post_in_background(
    url: str, body: Any, timeout: float = 60.0
) -> tuple[threading.Thread, list[httpx.Response | Exception]]:
    """``post`` on a thread, started: the thread, and the list its answer (the response, or
    the client's error) lands in."""
    answer: list[httpx.Response | Exception] = []

    def ask() -> None:
        try:
            answer.append(post(url, body, timeout=timeout))
        except httpx.HTTPError as exc:
            answer.append(exc)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return thread, answer


def mtp_stats(base: str) -> dict[str, Any]:
    r = httpx.get(base + "/debug/mtp_stats", timeout=10.0)
    assert r.status_code == 200, r.text
    return dict(r.json())


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed with prometheus_client: {(sample name, sorted labels): value}, without
    the labels every sample of a one-model, one-engine server shares (``model_name``, ``engine``)."""
    r = httpx.get(base + "/metrics", timeout=10.0)
    assert r.status_code == 200, r.text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            shared = ("model_name", "engine")
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in shared))
            out[(sample.name, labels)] = sample.value
    return out


def families(base: str) -> dict[str, str]:
    """``/metrics`` family name -> type."""
    r = httpx.get(base + "/metrics", timeout=10.0)
    return {f.name: f.type for f in text_string_to_metric_families(r.text)}


def metric(
    samples: dict[Any, float], name: str, default: float | None = None, **labels: str
) -> float:
    """One sample's value; ``default`` for a labelled series that has no child yet."""
    key = (name, tuple(sorted(labels.items())))
    if default is not None:
        return samples.get(key, default)
    return samples[key]


def labelled(samples: dict[Any, float], name: str, label: str) -> dict[str, float]:
    """Every sample of ``name`` keyed by the value of ``label``."""
    return {dict(lbls)[label]: v for (n, lbls), v in samples.items() if n == name}


def sse_events(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order; asserts the framing."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-200:]
    events = text.split("\n\n")[:-1]
    payloads = []
    for event in events:
        assert event.startswith("data: "), event
        assert "\n" not in event, event
        payloads.append(event[len("data: ") :])
    return payloads


def sse_json(raw: bytes) -> list[dict[str, Any]]:
    """Parse an SSE body that must end with exactly one ``[DONE]``; returns the JSON chunks."""
    payloads = sse_events(raw)
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    assert payloads.count("[DONE]") == 1
    return [json.loads(p) for p in payloads[:-1]]


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def idle(base: str) -> bool:
    """Nothing running or waiting and the KV cache empty."""
    s = scrape(base)
    return (
        metric(s, "vllm:num_requests_running") == 0
        and metric(s, "vllm:num_requests_waiting") == 0
        and metric(s, "vllm:kv_cache_usage_perc") == 0
    )


# ---------------------------------------------------------------------------- per-request stats

CHOICE_KEYS = {
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_steps",
    "num_spec_tokens",
    "num_decode_steps",
}
PER_STEP_KEYS = {"per_step_accepted", "per_step_drafted"}


def check_choice_stats(stats: Any, level: str, k: int = K) -> dict[str, Any]:
    """The per-choice ``speculative_decoding_stats`` of a forced K = 7, AL 3.78 run."""
    assert isinstance(stats, dict), stats
    expected = CHOICE_KEYS | (PER_STEP_KEYS if level == "detailed" else set())
    assert set(stats) == expected
    hist = stats["acceptance_histogram"]
    assert isinstance(hist, dict)
    assert all(isinstance(key, str) for key in hist)
    # The minimum-variance schedule [1, 1, 0.78, 0, ...] accepts exactly 2 or 3 drafts a step.
    assert set(hist) <= {"2", "3"}, hist
    assert all(isinstance(n, int) and n > 0 for n in hist.values()), hist
    steps = stats["num_spec_steps"]
    accepted = stats["num_accepted_draft_tokens"]
    assert steps == sum(hist.values()) > 0
    assert accepted == sum(int(j) * n for j, n in hist.items())
    assert stats["num_spec_tokens"] == k
    assert stats["num_draft_tokens"] == k * steps  # forced acceptance drafts all K every step
    assert stats["num_decode_steps"] == steps  # so every decode step is a verify step
    assert stats["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert stats["draft_acceptance_rate"] == pytest.approx(accepted / stats["num_draft_tokens"])
    if level == "detailed":
        per_acc, per_draft = stats["per_step_accepted"], stats["per_step_drafted"]
        assert len(per_acc) == len(per_draft) == steps
        assert per_draft == [k] * steps
        assert sum(per_acc) == accepted
        assert {str(j): per_acc.count(j) for j in set(per_acc)} == hist
    return stats


def check_root_metrics(root: Any, choice: dict[str, Any], level: str, k: int = K) -> None:
    """vLLM's root ``metrics.speculative_decoding`` agrees with the per-choice object."""
    assert isinstance(root, dict) and set(root) == {"speculative_decoding"}, root
    spec = root["speculative_decoding"]
    expected = CHOICE_KEYS | (PER_STEP_KEYS if level == "detailed" else set())
    assert set(spec) == expected
    dense = spec["acceptance_histogram"]
    assert isinstance(dense, list) and len(dense) == k + 1
    assert dense == [choice["acceptance_histogram"].get(str(j), 0) for j in range(k + 1)]
    for key in expected - {"acceptance_histogram"}:
        assert spec[key] == choice[key], key


def check_token_count(stats: dict[str, Any], completion_tokens: int, max_tokens: int) -> None:
    """With ignore_eos and finish_reason length, the steps that ran emitted exactly max_tokens:
    one token from the prefill, then accepted + 1 per verify step, the last step cut at the cap."""
    assert completion_tokens == max_tokens
    per_step = [a + 1 for a in stats["per_step_accepted"]]
    assert 1 + sum(per_step[:-1]) < max_tokens <= 1 + sum(per_step)
