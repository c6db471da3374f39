"""A sweep point's figures do not depend on where it runs: the same in this process, in spawned
processes and in a Ray worker, which runs with one BLAS thread (Ray sets ``OMP_NUM_THREADS=1``)
where this process runs with one a core. A BLAS dot product sums in an order that depends on its
threads, so the latency sketch's total must not be one."""

from __future__ import annotations

import os
import subprocess
import sys

TOTAL = """
import numpy as np
from speclens.sim.sketch import Sketch
rng = np.random.default_rng(1)
sketch = Sketch()
sketch.add(rng.random(200_000), rng.integers(1, 5, 200_000).astype(float))
print(repr(sketch.total))
"""


def _total(threads: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", TOTAL], env=env, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.strip()


def test_the_sketch_total_is_the_same_on_one_blas_thread_or_two() -> None:
    assert _total(1) == _total(2)
