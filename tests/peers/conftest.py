"""The peer tier: tests against a real vLLM 0.32.0 (CPU build), run by ``make test-peers``.

Not part of ``make test`` (pyproject's addopts ignore this directory): it needs a pinned vLLM
environment (built once by ``tests/peers/vllm_env.py``, cached outside the checkout) and each vLLM
start takes about a minute. A missing environment fails the tier; it never skips.

Fixtures for peer tests (every item here is marked ``peers``):

- ``smollm2_dir`` (session): a Hugging Face directory written by ``speclens export smollm2 DIR``,
  the same weights speclens's engine loads as ``smollm2``.
- ``vllm_server`` (session): a ``Peer(base_url, model, model_dir, speculative)`` NamedTuple (it
  unpacks as four values): vLLM serving ``smollm2_dir`` as ``model`` on a free loopback port with
  n-gram speculation ``SPECULATIVE`` (K 4, ``prompt_lookup_min``/``max`` 2..4), per-request
  metrics on, float32, eager. Started once, stopped (process group, SIGTERM then SIGKILL) when
  the session ends: its worker busy-polls a core even when idle.
- ``vllm_launcher`` (session): ``with vllm_launcher(speculative=None, extra_args=()) as peer:``
  starts another vLLM on the same weights (``speculative=None``: no speculation) and stops it when
  the block ends. Two cores: stop it as soon as the test has what it needs.

- ``llamacpp_launcher`` (session): ``with llamacpp_launcher(spec_args) as peer:`` starts llama.cpp's
  ``llama-server`` b11434 (built once by ``tests/peers/llamacpp_env.py``) on the SmolLM2 GGUF
  speclens loads as ``smollm2``, with ``--metrics`` and the given speculation flags, sends one
  warm-up request (its first requests can be very slow) and stops it when the block ends. It
  starts in seconds, so each test starts its own.

``SPECLENS_PEERS_MODEL_DIR`` names an already exported directory to skip the export (for
iterating on a test; the tier itself exports).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import llamacpp_env  # this directory is on sys.path (pytest's prepend import mode)
import peerlaunch
import pytest
import vllm_env

from serverkit import ServerProcess, free_port

# Tests call the CLI in process (CliRunner), whose logging setup points the root handler at a
# stream closed after the call: httpx's per-request INFO lines then print "Logging error".
logging.getLogger("httpx").setLevel(logging.WARNING)

SERVED_MODEL = vllm_env.SERVED_MODEL
SPECULATIVE: dict[str, Any] = vllm_env.NGRAM
#: Measured 36-66 s on a quiet 2-core machine and 188 s on one loaded by other work.
STARTUP_TIMEOUT_S = 480.0
#: ``speclens serve`` on SmolLM2 starts in seconds; this bounds a machine under load.
SPECLENS_STARTUP_TIMEOUT_S = 240.0


class Peer(NamedTuple):
    base_url: str
    model: str
    model_dir: Path
    speculative: dict[str, Any] | None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.peers)


def _why(path: Path, chars: int = 3000) -> str:
    """The log's distinct ``...Error: ...`` lines first (vLLM buries the root cause under its
    engine-core traceback), then its tail."""
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    errors = dict.fromkeys(
        line.split("] ", 1)[-1] for line in text.splitlines() if "Error: " in line
    )
    return "\n".join([*list(errors)[:5], "--- log tail ---", text[-chars:]])


def _prepare(env: Any, what: str, log_dir: Path, name: str) -> tuple[int, Path]:
    """Fail unless ``env`` (``vllm_env`` or ``llamacpp_env``) is built; a free port and its log."""
    if not env.ready():
        pytest.fail(
            f"{what} is not built: run `make test-peers` (or `python {Path(env.__file__).name}` "
            f"in tests/peers); expected {env.stamp()}",
            pytrace=False,
        )
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    return port, log_dir / f"{name}-{port}.log"


@contextlib.contextmanager
def running_vllm(
    model_dir: Path,
    log_dir: Path,
    speculative: dict[str, Any] | None = SPECULATIVE,
    extra_args: Sequence[str] = (),
) -> Iterator[Peer]:
    """A vLLM API server on a free loopback port, healthy and serving, stopped on exit."""
    port, log = _prepare(vllm_env, "the vLLM peer environment", log_dir, "vllm")
    cmd = vllm_env.command(model_dir, port, speculative, extra_args)
    started = time.monotonic()
    try:
        with peerlaunch.running(
            "vLLM", cmd, port, log, STARTUP_TIMEOUT_S, vllm_env.environment()
        ) as url:
            print(f"vLLM ready on {url} in {time.monotonic() - started:.0f} s (log {log})")
            yield Peer(url, SERVED_MODEL, model_dir, speculative)
    except peerlaunch.StartError as exc:
        pytest.fail(f"{exc}:\n{_why(log)}")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SPECLENS_PEERS_MODEL_DIR")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("export") / SERVED_MODEL
    done = subprocess.run(
        [sys.executable, "-m", "speclens", "export", "smollm2", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"speclens export smollm2 failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return out


@pytest.fixture(scope="session")
def vllm_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    with running_vllm(smollm2_dir, tmp_path_factory.mktemp("vllm")) as peer:
        yield peer


@pytest.fixture(scope="module")
def speclens_ngram(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory, vllm_server: Peer
) -> Iterator[ServerProcess]:
    """``speclens serve`` on the exported weights with vLLM's speculative config, served as
    vLLM's model name (for the module that asks for it)."""
    server = ServerProcess(
        ["--model", str(smollm2_dir), "--served-model-name", SERVED_MODEL,
         "--speculative-config", json.dumps(vllm_server.speculative),
         "--per-request-spec-decode-stats", "summary", "--max-model-len", "2048",
         "--kv-cache-tokens", "16384"],
        tmp_path_factory.mktemp("speclens-ngram"),
    )  # fmt: skip
    try:
        server.start().wait_ready(SPECLENS_STARTUP_TIMEOUT_S)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_launcher(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., contextlib.AbstractContextManager[Peer]]:
    log_dir = tmp_path_factory.mktemp("vllm-extra")

    def launch(
        speculative: dict[str, Any] | None = None, extra_args: Sequence[str] = ()
    ) -> contextlib.AbstractContextManager[Peer]:
        return running_vllm(smollm2_dir, log_dir, speculative, extra_args)

    return launch


LLAMACPP_DRAFT_MODEL = llamacpp_env.DRAFT_MODEL
LLAMACPP_NGRAM = llamacpp_env.NGRAM
LLAMACPP_STARTUP_TIMEOUT_S = 120.0
llamacpp_command = llamacpp_env.command


@contextlib.contextmanager
def running_llamacpp(log_dir: Path, spec_args: Sequence[str]) -> Iterator[Peer]:
    """``llama-server`` on a free loopback port, healthy and warmed up, stopped on exit."""
    from speclens.engine.weights_gguf import smollm2_gguf_path

    port, log = _prepare(llamacpp_env, "the llama.cpp peer", log_dir, "llama-server")
    gguf = smollm2_gguf_path()
    cmd = llamacpp_command(gguf, port, spec_args)
    started = time.monotonic()
    try:
        with peerlaunch.running(
            "llama-server", cmd, port, log, LLAMACPP_STARTUP_TIMEOUT_S, poll_s=0.2
        ) as url:
            warm = httpx.post(
                url + "/completion", json={"prompt": "Hello", "n_predict": 8}, timeout=300.0
            )
            warm.raise_for_status()
            print(f"llama-server ready on {url} in {time.monotonic() - started:.1f} s (log {log})")
            yield Peer(url, SERVED_MODEL, gguf, {"llama-server": list(spec_args)})
    except peerlaunch.StartError as exc:
        pytest.fail(f"{exc}:\n{_why(log)}")


@pytest.fixture(scope="session")
def llamacpp_launcher(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[Sequence[str]], contextlib.AbstractContextManager[Peer]]:
    log_dir = tmp_path_factory.mktemp("llama-server")

    def launch(spec_args: Sequence[str]) -> contextlib.AbstractContextManager[Peer]:
        return running_llamacpp(log_dir, spec_args)

    return launch
