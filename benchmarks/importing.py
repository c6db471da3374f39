"""``speclens import inferencex`` of every published configuration: without plots (the default)
against ``--plots`` (what every import drew before), and ``speclens report`` drawing one
configuration's plots afterwards. Each command runs as a user runs it, in its own process, so
the times include Python's start and the imports.

    python benchmarks/importing.py [--rounds 2] [FILE ...]

FILEs default to InferenceX's published files beside the repository
(``../shared/data/inferencex/benchmarks.json`` and ``benchmarks-history.json``).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "inferencex"
GOAL_S = 10.0


def timed(args: list[str]) -> tuple[float, float, str]:
    """Wall and CPU seconds (the child's user + system) of ``speclens ARGS``, and its last line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "speclens", *args], capture_output=True,
                          text=True, check=False)  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"speclens {' '.join(args[:2])} failed ({proc.returncode}): "
                         f"{proc.stderr[-400:]}")  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, (proc.stdout.strip().splitlines() or [""])[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path,
                        default=[DATA / "benchmarks.json", DATA / "benchmarks-history.json"])  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"machine: {describe()}")
    rows: dict[str, list[tuple[float, float]]] = {"import": [], "import --plots": [],
                                                   "report (one configuration)": []}  # fmt: skip
    last = ""
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # interleaved: both variants see the same machine
            plain, plotted = Path(tmp) / f"plain{r}", Path(tmp) / f"plots{r}"
            files = [str(f) for f in args.files]
            wall, cpu, last = timed(["import", "inferencex", *files, "--output-dir", str(plain)])
            rows["import"].append((wall, cpu))
            wall, cpu, _ = timed(["import", "inferencex", *files, "--output-dir", str(plotted),
                                  "--plots"])  # fmt: skip
            rows["import --plots"].append((wall, cpu))
            first = sorted(p for p in plain.iterdir() if p.is_dir())[0]
            wall, cpu, _ = timed(["report", str(first)])
            rows["report (one configuration)"].append((wall, cpu))
    print(last)
    base = statistics.median(w for w, _ in rows["import --plots"])
    print("| run | wall s (median) | CPU s (median) | ratio to --plots |\n|---|---:|---:|---:|")
    for name, values in rows.items():
        wall = statistics.median(w for w, _ in values)
        cpu = statistics.median(c for _, c in values)
        ratio = f"{wall / base:.3f}" if name != "report (one configuration)" else ""
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {ratio} |")
    wall = statistics.median(w for w, _ in rows["import"])
    print(
        f"goal: every configuration imported in under {GOAL_S:.0f} s: "
        f"{'met' if wall < GOAL_S else 'not met'} ({wall:.2f} s)"
    )


if __name__ == "__main__":
    main()
