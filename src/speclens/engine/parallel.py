"""Tensor parallelism for the reference engine: N rank processes, one step at a time, together.

Every rank holds a full ``Engine`` (scheduler, requests, KV pool for its heads) and runs every
step. Rank 0 owns the requests and the HTTP server: before each step it broadcasts the step's
plan (the adds and aborts since the last one, the batch it scheduled); the other ranks apply the
same adds and aborts, schedule on their own (the scheduler and block manager are deterministic)
and refuse to go on when their batch is not rank 0's. In the forward each rank computes its
shard (Megatron: column-parallel q/k/v and gate/up, row-parallel o_proj and down, each followed
by one all-reduce); the LM head is replicated. N-gram proposals are made on rank 0 and broadcast;
a draft model is sharded like the target. Sampled tokens are broadcast from rank 0, while each
rank's accepted counts stay its own: under forced acceptance every rank draws its accept
decisions from ``SyntheticAcceptance``'s per-step stream, which is the lockstep claim this
exercises. ``debug_lockstep`` adds one all-reduce per decode step comparing a checksum of the
accepted counts, so a desynchronised draw fails loudly at the step it happens.

This module holds the group: each rank's step protocol (``Rank``), starting and watching the
rank processes, and the follower's entry. The collectives are in ``parallel_comm``, the model's
shards in ``parallel_shard``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from speclens.engine.config import ConfigError, EngineConfig
from speclens.engine.lockstep import LockstepError
from speclens.engine.model import LlamaModel
from speclens.engine.parallel_comm import Comm, RankDied
from speclens.engine.parallel_shard import shard_model, shard_problem
from speclens.engine.request import SamplingParams
from speclens.sampling.rejection import SamplerOutput

if TYPE_CHECKING:
    from speclens.engine.drafters import Proposal
    from speclens.engine.engine import Engine

log = logging.getLogger(__name__)

#: Test-only: the rank with this number fails while starting (a rank that cannot start).
FAIL_RANK_ENV = "SPECLENS_TEST_FAIL_RANK"
#: How long rank 0 waits for the other ranks to load their shards and join.
STARTUP_TIMEOUT_S = 300.0
#: gloo's own timeout, never reached: an idle follower waits for rank 0's next plan in one.
#: A rank that dies is seen by rank 0's monitor (and by gloo as a closed connection).
COLLECTIVE_TIMEOUT = datetime.timedelta(days=7)
#: How long rank 0 waits in one collective before it calls the group wedged (a rank stopped or
#: hung): its monitor then kills the other ranks, which fails the collective, the engine and
#: every request (``serve --collective-timeout``). One collective spans one layer's forward at
#: most, so a healthy rank answers far sooner.
COLLECTIVE_TIMEOUT_S = 60.0
#: An idle rank 0 checks that the ranks answer (one broadcast plan and one all-reduce) this often.
HEARTBEAT_S = 1.0
#: Bound on the per-step log each rank keeps (steps).
LOG_STEPS = 100_000
_PR_SET_PDEATHSIG = 1


def capacity_problem(size: int, device: str) -> str | None:
    """Why this machine cannot run ``size`` ranks on ``device``, or None."""
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if size > count:
            return (
                f"--tensor-parallel-size {size}: this machine has {count} CUDA device(s), "
                f"expected one device per rank"
            )
        return None
    if device != "cpu":
        return f"--tensor-parallel-size {size}: --device {device}: expected cpu or cuda"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if size > (cores or 1):
        return (
            f"--tensor-parallel-size {size}: this machine gives the process {cores} CPU "
            f"core(s), expected at most one rank per core"
        )
    return None


# ---------------------------------------------------------------------- one rank
@dataclass
class Rank:
    """This process's place in the group and what it shares with the others each step."""

    rank: int
    size: int
    device: torch.device
    debug_lockstep: bool = False
    comm: Comm = field(init=False)
    #: Per decode step, this rank's accepted counts (bounded; compared across ranks in tests).
    accepted_log: deque[list[int]] = field(default_factory=lambda: deque(maxlen=LOG_STEPS))
    #: What a dead rank left behind (rank 0 only): set by the monitor, raised by ``check``.
    dead: str | None = None
    #: Rank 0: the longest one collective may take before the group is called wedged.
    timeout_s: float = COLLECTIVE_TIMEOUT_S
    journal: list[list[Any]] = field(default_factory=list)
    group: _Group | None = None
    steps: int = 0

    def __post_init__(self) -> None:
        self.comm = Comm(self.rank, self.size)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def shard(self, model: LlamaModel) -> None:
        problem = shard_problem(model.config, self.size)
        if problem is not None:
            raise ConfigError(problem)
        shard_model(model, self.rank, self.size, self.comm)

    def check(self) -> None:
        if self.dead is not None:
            raise RankDied(self.dead)

    def close(self) -> None:
        """Rank 0: stop the other ranks and leave the group (``close``). Idempotent."""
        close(self)

    # -- the plan
    def note_add(self, ids: Sequence[int], params: SamplingParams, request_id: str) -> None:
        self.journal.append(["add", list(ids), asdict(params), request_id])

    def note_abort(self, request_id: str) -> None:
        self.journal.append(["abort", request_id])

    def send_plan(self, kind: str, request_ids: list[str]) -> None:
        """Rank 0: the adds and aborts since the last plan, then this step's batch."""
        self.check()
        plan = {"op": "step", "events": self.journal, "kind": kind, "ids": request_ids}
        self.comm.broadcast_json(plan, self.device)
        self.journal = []

    def receive(self) -> Any:
        return self.comm.broadcast_json(None, self.device)

    def heartbeat(self) -> None:
        """Rank 0, idle: every ``HEARTBEAT_S``, a plan that asks each rank to answer one
        all-reduce, so a rank that stopped answering is found (by the monitor's timeout) while
        no request is running too."""
        self.check()
        if time.monotonic() - self.comm.last_done < HEARTBEAT_S:
            return
        self.comm.broadcast_json({"op": "ping"}, self.device)
        self.answer_ping()

    def answer_ping(self) -> None:
        self.comm.all_reduce(torch.zeros(1, dtype=torch.int64, device=self.device), "ping")

    # -- the step's shared tensors
    def share_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Prefill: rank 0's sampled first tokens."""
        return self.comm.broadcast(tokens.to(torch.int64).contiguous(), "tokens")

    def share_proposal(self, proposal: Proposal | None, batch: int, k: int) -> torch.Tensor:
        """Rank 0's drafts and their counts, [B, K + 1] (the counts in the last column)."""
        if proposal is not None and self.leader:
            packed = torch.cat([proposal.token_ids, proposal.num_tokens.unsqueeze(1)], dim=1)
        else:
            packed = torch.zeros((batch, k + 1), dtype=torch.int64, device=self.device)
        return self.comm.broadcast(packed.to(torch.int64).contiguous(), "proposal")

    def share_sampled(self, out: SamplerOutput, forced: bool) -> SamplerOutput:
        """Rank 0's output tokens. Under forced acceptance the accepted counts stay each rank's
        own (drawn in lockstep, never broadcast); otherwise they ride with the tokens."""
        if forced:
            tokens = self.comm.broadcast(out.output_token_ids.contiguous(), "tokens")
            return SamplerOutput(tokens, out.num_accepted)
        packed = torch.cat([out.output_token_ids, out.num_accepted.unsqueeze(1)], dim=1)
        packed = self.comm.broadcast(packed.contiguous(), "tokens")
        return SamplerOutput(packed[:, :-1], packed[:, -1])

    def check_lockstep(self, num_accepted: torch.Tensor) -> None:
        """Debug: one all-reduce (MAX of the checksum and of its negation) per decode step; the
        ranks agree when the maximum and the minimum are equal."""
        weights = torch.arange(1, num_accepted.shape[0] + 1, device=num_accepted.device)
        checksum = (num_accepted.to(torch.int64) * (weights * 1_000_003 + 7)).sum()
        both = torch.stack([checksum, -checksum])
        self.comm.all_reduce(both, "lockstep", dist.ReduceOp.MAX)
        high, low = both.tolist()
        if high != -low:
            raise LockstepError(
                f"rank {self.rank}: --debug-lockstep: the ranks' accepted counts differ at "
                f"decode step {self.steps} (checksums from {-low} to {high}); the forced draw "
                f"is not in lockstep"
            )

    def record(self, accepted: list[int]) -> None:
        self.steps += 1
        self.accepted_log.append(accepted)

    def gather_logs(self) -> list[list[list[int]]]:
        """Rank 0, between steps: every rank's per-step accepted counts, rank by rank."""
        self.comm.broadcast_json({"op": "report"}, self.device)
        gathered: list[Any] = [None] * self.size
        with self.comm._timed("report"):
            dist.gather_object(list(self.accepted_log), gathered if self.leader else None, dst=0)
        return gathered

    def answer_report(self) -> None:
        dist.gather_object(list(self.accepted_log), None, dst=0)


# ---------------------------------------------------------------------- starting the group
@dataclass
class _Group:
    """Rank 0's view of the other ranks: their processes and the rendezvous store."""

    store: Any
    processes: list[subprocess.Popen[bytes]]
    closing: bool = False
    monitor: threading.Thread | None = None
    threads: int = 0


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _rank_device(config: EngineConfig, rank: int) -> str:
    return f"cuda:{rank}" if config.device.startswith("cuda") else config.device


def _threads_per_rank(size: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // size)


def launch(config: EngineConfig, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> Engine:
    """Rank 0's engine with ranks 1..N-1 started beside it and joined: ``join(start(config))``."""
    return join(config, start(config, timeout_s))


def start(config: EngineConfig, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> Rank:
    """Start ranks 1..N-1 (they load their shards meanwhile); refuses (``ConfigError``, one line)
    a size this machine cannot take. Call it on a thread that outlives the ranks (the main
    thread): Linux's parent-death signal fires when the thread that started a process ends.
    ``timeout_s``: the longest rank 0 waits in one collective before it stops the group."""
    size = config.tensor_parallel_size
    problem = capacity_problem(size, config.device)
    if problem is not None:
        raise ConfigError(problem)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
    )  # fmt: skip
    group = _Group(store, [], threads=torch.get_num_threads())
    rank = Rank(0, size, torch.device(_rank_device(config, 0)), config.debug_lockstep)
    rank.group, rank.timeout_s = group, timeout_s
    try:
        payload = pickle.dumps(config)
        for r in range(1, size):
            group.processes.append(_start_rank(r, size, store.port, payload))
    except BaseException:
        _stop_ranks(group)
        raise
    atexit.register(close, rank)
    return rank


def join(config: EngineConfig, rank: Rank) -> Engine:
    """Build rank 0's engine and join the ranks ``start`` began; a rank that fails to start is
    refused (``ConfigError``, one line), and on any failure every rank is stopped."""
    from speclens.engine.engine import Engine

    group = rank.group
    assert group is not None
    size = config.tensor_parallel_size
    try:
        torch.set_num_threads(_threads_per_rank(size))
        engine = Engine(config, parallel=rank)
        _wait_for_ranks(group, size)
        dist.init_process_group(
            _backend(rank.device), store=group.store, rank=0, world_size=size,
            timeout=COLLECTIVE_TIMEOUT,
        )  # fmt: skip
    except BaseException:
        _stop_ranks(group)
        torch.set_num_threads(group.threads)
        raise
    group.monitor = threading.Thread(target=_watch, args=(rank,), daemon=True, name="tp-watch")
    group.monitor.start()
    log.info(
        "tensor parallel: %d ranks (%s), rank pids %s", size, _backend(rank.device),
        [os.getpid(), *(p.pid for p in group.processes)],
    )  # fmt: skip
    return engine


def _start_rank(rank: int, size: int, port: int, payload: bytes) -> subprocess.Popen[bytes]:
    main = "import sys; from speclens.engine.parallel import follower_main; "
    main += "sys.exit(follower_main(sys.argv[1:]))"
    command = [sys.executable, "-c", main, str(rank), str(size), str(port), str(os.getpid())]
    process = subprocess.Popen(command, stdin=subprocess.PIPE)
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        process.stdin.write(payload)
        process.stdin.close()
    return process


def _wait_for_ranks(group: _Group, size: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        for r, process in enumerate(group.processes, start=1):
            if group.store.check([f"error/{r}"]):
                message = group.store.get(f"error/{r}").decode(errors="replace")
                raise ConfigError(f"--tensor-parallel-size {size}: rank {r} failed to start: "
                                  f"{message}")  # fmt: skip
            if process.poll() is not None:
                raise ConfigError(
                    f"--tensor-parallel-size {size}: rank {r} exited with code "
                    f"{process.returncode} while starting"
                )
        if group.store.check([f"ready/{r}" for r in range(1, size)]):
            return
        if time.monotonic() > deadline:
            raise ConfigError(
                f"--tensor-parallel-size {size}: the ranks did not start within "
                f"{STARTUP_TIMEOUT_S:g} s"
            )
        time.sleep(0.05)


def _watch(rank: Rank) -> None:
    """Rank 0's monitor: a rank that exits, or a collective that outlasts ``rank.timeout_s``
    (a rank stopped or hung), ends the engine. A wedged group's ranks are killed, which fails
    the collective rank 0 waits in; either way the next collective or check raises
    ``RankDied`` with the reason."""
    group = rank.group
    assert group is not None
    while not group.closing:
        for r, process in enumerate(group.processes, start=1):
            if process.poll() is not None and not group.closing:
                _fail(rank, f"tensor-parallel rank {r} exited with code {process.returncode}")
                return
        waiting = rank.comm.waiting
        if waiting is not None and time.monotonic() - waiting[1] > rank.timeout_s:
            if group.closing:
                return
            pids = [p.pid for p in group.processes]
            _fail(
                rank,
                f"tensor-parallel ranks did not complete a collective ({waiting[0]}) within "
                f"{rank.timeout_s:g} s (--collective-timeout): a rank is stopped or hung; "
                f"stopping the other ranks (pids {pids})",
            )
            for process in group.processes:
                with contextlib.suppress(OSError):
                    process.kill()
            return
        time.sleep(0.1)


def _fail(rank: Rank, reason: str) -> None:
    rank.dead = rank.comm.failure = reason
    log.error("%s; the engine cannot go on", reason)


def close(rank: Rank | None) -> None:
    """Rank 0: tell the other ranks to stop, wait for them (then kill), leave the group.
    Idempotent; also run at exit."""
    if rank is None or rank.group is None or rank.group.closing:
        return
    group = rank.group
    group.closing = True
    if rank.dead is None and dist.is_initialized():
        with contextlib.suppress(Exception):
            rank.comm.broadcast_json({"op": "stop"}, rank.device)
    _stop_ranks(group)
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()
    torch.set_num_threads(group.threads)


def _stop_ranks(group: _Group, grace_s: float = 5.0) -> None:
    group.closing = True
    deadline = time.monotonic() + grace_s
    for process in group.processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        if process.poll() is None:
            process.kill()
            process.wait()


# ---------------------------------------------------------------------- ranks 1..N-1
def _die_with_parent(parent: int) -> None:
    """A rank never outlives rank 0: the kernel kills it when its parent dies (Linux
    PR_SET_PDEATHSIG), and a thread polls the parent's pid where that is not available or the
    parent died before the call."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def poll() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.2)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=poll, daemon=True, name="tp-parent").start()


def follower_main(argv: Sequence[str]) -> int:
    """Rank ``argv[0]`` of ``argv[1]``: load the shard, join, follow rank 0 until it stops."""
    rank_no, size, port, parent = (int(a) for a in argv[:4])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches rank 0, which stops us
    logging.basicConfig(level=logging.WARNING, format=f"rank {rank_no}: %(message)s")
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", port, size, is_master=False,
        timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
    )  # fmt: skip
    try:
        config: EngineConfig = pickle.loads(sys.stdin.buffer.read())
        if os.environ.get(FAIL_RANK_ENV) == str(rank_no):
            raise RuntimeError(f"{FAIL_RANK_ENV}={rank_no} (a test-only switch)")
        torch.set_num_threads(_threads_per_rank(size))
        rank = Rank(rank_no, size, torch.device(_rank_device(config, rank_no)),
                    config.debug_lockstep)  # fmt: skip
        from speclens.engine.engine import Engine

        engine = Engine(config, parallel=rank)
    except Exception as exc:
        store.set(f"error/{rank_no}", f"{type(exc).__name__}: {exc}"[:2000])
        return 1
    store.set(f"ready/{rank_no}", "1")
    dist.init_process_group(
        _backend(rank.device), store=store, rank=rank_no, world_size=size,
        timeout=COLLECTIVE_TIMEOUT,
    )  # fmt: skip
    try:
        follow(engine, rank)
    except Exception:
        log.exception("rank %d failed", rank_no)
        return 1
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0


def follow(engine: Engine, rank: Rank) -> None:
    """Run rank 0's steps until it says stop."""
    while True:
        plan = rank.receive()
        op = plan.get("op")
        if op == "stop":
            return
        if op == "report":
            rank.answer_report()
            continue
        if op == "ping":
            rank.answer_ping()
            continue
        engine.follow(plan)
