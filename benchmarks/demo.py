"""``make demo`` on a fresh clone, the README's first command: the install it waits for, then the
demo itself. The baseline, in the same run, is a second fresh clone that installs everything
``make test`` needs before the demo (what ``make demo`` waited for until it installed only the
core and the engine).

    python benchmarks/demo.py [--no-baseline]

Clones the repository's committed HEAD into a temporary directory (nothing uncommitted is
measured). PyTorch's CPU wheel must be installable without a download (see the Makefile's TORCH).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 60.0


def step(cwd: Path, *target: str) -> float:
    """Wall seconds of ``make TARGET`` in ``cwd``; exits naming the target when it fails."""
    start = time.perf_counter()
    proc = subprocess.run(["make", *target], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"make {' '.join(target)} failed ({proc.returncode}): "
                         f"{(proc.stdout + proc.stderr)[-600:]}")  # fmt: skip
    return time.perf_counter() - start


def fresh(tmp: Path, name: str) -> Path:
    clone = tmp / name
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    return clone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the clone that installs the whole suite first")  # fmt: skip
    args = parser.parse_args()
    print(f"machine: {describe()}, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        clone = fresh(Path(tmp), "demo")
        install = step(clone, ".venv/.demo")
        demo = step(clone, "demo")
        rows = [("make demo (core and engine only)", install, demo)]
        if not args.no_baseline:
            clone = fresh(Path(tmp), "baseline")
            install = step(clone, ".venv/.installed")
            demo = step(clone, "demo")
            rows.append(("everything make test needs, then the demo (baseline)", install, demo))
    base = rows[-1][1] + rows[-1][2]
    print("| fresh clone | install s | demo s | total s | ratio to baseline |")
    print("|---|---:|---:|---:|---:|")
    for name, install, demo in rows:
        print(f"| {name} | {install:.1f} | {demo:.1f} | {install + demo:.1f} | "
              f"{(install + demo) / base:.2f} |")  # fmt: skip
    total = rows[0][1] + rows[0][2]
    print(
        f"goal: make demo on a fresh clone under {GOAL_S:.0f} s: "
        f"{'met' if total < GOAL_S else 'not met'} ({total:.1f} s)"
    )


if __name__ == "__main__":
    main()
