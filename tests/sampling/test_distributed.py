"""Tensor-parallel lockstep: every rank draws the same synthetic decisions, step after step.

Two processes (torch.multiprocessing, spawn) join a gloo process group. Each builds the same
SyntheticAcceptance(seed) and the same inputs, runs the same steps, and all-gathers its
num_accepted and output_token_ids every step; rank 0 checks them and writes the verdict to a file
that the test reads.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
STEPS = 20
BATCH, K = 256, 7
SEED = 2024
JOIN_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One TP rank. Module-level so that spawn can pickle it."""
    from speclens.sampling import SyntheticAcceptance, rejection_sample

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        synthetic = SyntheticAcceptance.from_length(3.78, K, seed=SEED)
        gen = torch.Generator().manual_seed(7)  # identical inputs on every rank
        argmax = torch.randint(0, 1000, (BATCH, K + 1), generator=gen)
        drafts = (argmax[:, :K] + 1) % 1000
        num_draft = torch.randint(0, K + 1, (BATCH,), generator=gen)
        bonus = torch.full((BATCH,), 1000)

        identical_every_step = True
        steps_seen: list[tuple[list[int], list[list[int]]]] = []
        for _ in range(STEPS):
            out = rejection_sample(
                "synthetic", drafts, num_draft, bonus, target_argmax=argmax, synthetic=synthetic
            )
            gathered_acc = [torch.empty_like(out.num_accepted) for _ in range(world_size)]
            gathered_tok = [torch.empty_like(out.output_token_ids) for _ in range(world_size)]
            dist.all_gather(gathered_acc, out.num_accepted)
            dist.all_gather(gathered_tok, out.output_token_ids)
            for other in range(1, world_size):
                identical_every_step &= torch.equal(gathered_acc[0], gathered_acc[other])
                identical_every_step &= torch.equal(gathered_tok[0], gathered_tok[other])
            steps_seen.append((gathered_acc[0].tolist(), gathered_tok[0].tolist()))

        if rank == 0:
            distinct = len({json.dumps(s) for s in steps_seen})
            result = {
                "world_size": world_size,
                "steps": len(steps_seen),
                "final_step_counter": synthetic.step,
                "identical_every_step": identical_every_step,
                "distinct_steps": distinct,
                "consecutive_steps_differ": all(
                    steps_seen[i][0] != steps_seen[i + 1][0] for i in range(len(steps_seen) - 1)
                ),
                "accepted_values": sorted({a for acc, _ in steps_seen for a in acc}),
            }
            (Path(out_dir) / "result.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_tp_ranks_draw_identical_decisions(tmp_path: Path) -> None:
    context = mp.start_processes(
        _worker,
        args=(WORLD_SIZE, _free_port(), str(tmp_path)),
        nprocs=WORLD_SIZE,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while not context.join(timeout=1.0):  # raises if a worker failed
            if time.monotonic() > deadline:
                pytest.fail(f"TP workers did not finish within {JOIN_TIMEOUT_S:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=10)

    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == WORLD_SIZE
    assert result["steps"] == STEPS
    assert result["final_step_counter"] == STEPS
    assert result["identical_every_step"] is True
    assert result["distinct_steps"] == STEPS
    assert result["consecutive_steps_differ"] is True
    # 0..3 accepted: requests with fewer than 3 real drafts cap the count.
    assert set(result["accepted_values"]) <= {0, 1, 2, 3}
