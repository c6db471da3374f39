"""The engine: continuous-batching speculative decoding, one short step at a time.

``step()`` reads like the algorithm: schedule -> propose -> verify -> rejection_sample ->
postprocess (append, roll back the KV of rejected slots, finish requests, count statistics).
The ``sim`` executor replaces only the forward passes (and the drafter's cost).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from speclens.acceptance.spread import request_uniform
from speclens.engine import logits as logits_ops
from speclens.engine.config import ConfigError, EngineConfig, layer_subset
from speclens.engine.drafters import (
    DraftModelDrafter,
    NgramDrafter,
    Proposal,
    SimDrafter,
)
from speclens.engine.drafters import _one_hot as one_hot
from speclens.engine.executor import SimExecutor, TorchExecutor
from speclens.engine.kv_cache import BlockManager, blocks_for
from speclens.engine.lockstep import Lockstep, LockstepError, synthetic_for
from speclens.engine.model import KVPool, LlamaModel
from speclens.engine.request import (
    CompletionOutput,
    Request,
    RequestOutput,
    SamplingError,
    SamplingParams,
    StopMatcher,
)
from speclens.engine.scheduler import ScheduledBatch, Scheduler
from speclens.engine.tokenizer import IncrementalDecoder, Tokenizer
from speclens.engine.weights import load_model
from speclens.sampling import SpecDecodeStats, rejection_sample
from speclens.sampling.rejection import SamplerOutput

log = logging.getLogger(__name__)

Drafter = NgramDrafter | DraftModelDrafter | SimDrafter

#: Steps ``Engine.steps`` keeps: the last STEP_HISTORY to 2 * STEP_HISTORY. A server's engine
#: steps for as long as it runs, and an unbounded history grew its memory without end (about
#: 1.7 million records a day at 20 steps a second).
STEP_HISTORY = 100_000
#: Keys forced coverage's uniforms apart from a spread's, drawn from the same seed.
COVERAGE_KEY = 0xC0FE


@dataclass(slots=True)
class StepRecord:
    """What one step did and what it cost (real seconds for torch, priced for sim)."""

    kind: str
    num_requests: int
    query_tokens: int
    context_tokens: int
    seconds: float
    #: The drafter's share of ``seconds`` (its K forwards, or its priced cost).
    draft_seconds: float = 0.0


class Engine:
    """Speculative decoding over a continuous batch. Not thread-safe: drive it from one thread."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        target: LlamaModel | None = None,
        draft: LlamaModel | None = None,
        tokenizer: Tokenizer | None = None,
        parallel: Lockstep | None = None,
    ) -> None:
        """``parallel``: this process's tensor-parallel rank (``speclens.engine.parallel``
        builds it; an engine of ``tensor_parallel_size`` > 1 is started with ``launch``)."""
        self.config = config = config or EngineConfig()
        config.validate()
        self.parallel = parallel
        if parallel is None and config.tensor_parallel_size > 1:
            raise ConfigError(
                f"tensor_parallel_size {config.tensor_parallel_size}: start the ranks with "
                f"speclens.engine.parallel.launch(config), not Engine(config)"
            )
        spec = config.speculative
        self.k = spec.num_speculative_tokens if spec.enabled else 0
        self.device = parallel.device if parallel else torch.device(config.device)
        self.dtype = getattr(torch, config.dtype)
        #: The KV cache's dtype: float32 on a CPU whatever the weights'. bf16 queries attend in
        #: float32 (one SDPA call, its fast CPU kernel): over a bf16 cache SDPA took 0.3 to 1 ms a
        #: layer for one query row against 300 to 900 tokens (float32: 55 to 160 us).
        self.kv_dtype = torch.float32 if self.device.type == "cpu" else self.dtype
        if target is None or tokenizer is None:
            loaded, loaded_tokenizer = load_model(config.model, seed=config.seed)
            target, tokenizer = target or loaded, tokenizer or loaded_tokenizer
        self.target = target.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        if parallel is not None:
            parallel.shard(self.target)
        self.tokenizer = tokenizer
        self.vocab_size = target.config.vocab_size
        num_blocks = blocks_for(config.kv_cache_tokens, config.block_size)
        self.blocks = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(
            self.blocks, self.k, config.max_num_seqs, config.max_num_batched_tokens
        )
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.executor: TorchExecutor | SimExecutor
        if config.executor == "sim":
            self.executor = SimExecutor(self.vocab_size, config.step_cost, config.seed)
        else:
            kv = self._pool(self.target, self.target.num_layers)
            self.executor = TorchExecutor(self.target, kv, self.blocks)
        self.drafter: Drafter | None = self._drafter(draft) if self.k else None
        rates = spec.per_position_rates
        size = config.tensor_parallel_size
        spread = None if spec.acceptance_spread is None else spec.acceptance_spread.values
        self.synthetic = (
            synthetic_for(rates, spec.seed, size, spread, spec.rates_derived, spec.spread_coverage)
            if rates is not None
            else None
        )
        #: Forced with a spread: the decode batch's request ids key each row's own schedule.
        self._keyed = self.synthetic is not None and self.synthetic.spread is not None
        self.stats = SpecDecodeStats(self.k, enabled=spec.enabled)
        self.clock = 0.0
        self.steps: list[StepRecord] = []  # the most recent steps (STEP_HISTORY)
        self._draft_seconds = 0.0
        self._groups: dict[str, list[Request]] = {}
        self._emitted: dict[str, tuple[int, int]] = {}  # request -> (tokens, chars) sent
        #: Rank 0 of a tensor-parallel group: the other ranks see every add and abort.
        self._leader = parallel is not None and parallel.leader
        #: A follower's expected batch (rank 0's plan) for the step it is about to run.
        self._expected: tuple[str, list[str]] | None = None
        if spec.forced and (parallel is None or parallel.leader):
            log.info("%s", spec.log_line())

    # ------------------------------------------------------------------ set-up
    def _pool(self, model: LlamaModel, num_layers: int) -> KVPool:
        return KVPool(
            model.config,
            num_layers,
            self.blocks.num_blocks,
            self.blocks.block_size,
            self.kv_dtype,
            self.device,
            model.num_local_kv_heads,
        )

    def _drafter(self, draft: LlamaModel | None) -> Drafter:
        spec = self.config.speculative
        if self.config.executor == "sim":
            cost = self.config.step_cost
            return SimDrafter(self.k, self.vocab_size, self.config.seed + 1, cost)
        if spec.method == "ngram":
            # Forced acceptance needs K drafts every step: fill a short lookup up to K.
            return NgramDrafter(
                self.k,
                self.vocab_size,
                spec.ngram_max,
                spec.ngram_min,
                fill=spec.forced,
                max_model_len=self.config.max_model_len,
            )
        num_layers: int | None = None
        name = spec.draft_model or ("dummy-draft" if self.config.model == "dummy" else None)
        if draft is None and (name is None or name.startswith("layers:")):
            # A layer subset of the target: the first N layers, then its norm and LM head.
            num_layers = layer_subset(name) or max(1, self.target.num_layers // 4)
            if num_layers > self.target.num_layers:  # refused before its KV pool is sized by N
                raise ConfigError(
                    f"--draft-model {name}: the target has {self.target.num_layers} layers; "
                    f"a layer subset takes 1 to {self.target.num_layers} of them"
                )
            draft = self.target
        elif draft is None:
            assert name is not None
            draft, _ = load_model(name, seed=self.config.seed + 1)
        draft = draft.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        if self.parallel is not None and draft is not self.target:
            self.parallel.shard(draft)  # sharded like the target (a layer subset already is)
        if draft.config.vocab_size != self.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft.config.vocab_size}) differs from the "
                f"target's ({self.vocab_size})"
            )
        kv = self._pool(draft, num_layers or draft.num_layers)
        threshold = spec.confidence_threshold if spec.confidence_schedule else None
        return DraftModelDrafter(
            draft, kv, self.blocks, self.k, num_layers, threshold, self.generator
        )

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; returns its id. Raises ``SamplingError`` for an impossible one."""
        params = params or SamplingParams()
        request_id = request_id or uuid.uuid4().hex
        child_ids = [f"{request_id}-{i}" for i in range(params.n)] if params.n > 1 else [request_id]
        if request_id in self._groups or any(c in self._emitted for c in child_ids):
            raise SamplingError(f"request id {request_id!r} is already in use")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise SamplingError("the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise SamplingError(f"prompt token ids must lie in [0, {self.vocab_size})")
        limit = self.config.max_model_len
        if len(ids) + params.max_tokens > limit:
            raise SamplingError(
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{len(ids)} and max_tokens asks for {params.max_tokens} more"
            )
        stops = [s for s in params.stop if s]
        matcher = StopMatcher(stops) if stops else None
        stop_ids = frozenset(params.stop_token_ids)
        children = []
        for index, child_id in enumerate(child_ids):
            child = Request(
                request_id=child_id,
                prompt_token_ids=ids,
                params=params,
                eos_token_id=self.tokenizer.eos_token_id,
                parent_id=request_id,
            )
            child.acceptance.num_spec_tokens = self.k or None
            child.decoder = IncrementalDecoder(self.tokenizer)
            child.stop_matcher, child.stop_token_ids = matcher, stop_ids
            if params.seed is not None:
                child.generator = torch.Generator(device=self.device).manual_seed(
                    params.seed + index
                )
            children.append(child)
            self._emitted[child.request_id] = (0, 0)
            self.scheduler.add(child)
        self._groups[request_id] = children
        if self._leader:
            assert self.parallel is not None
            self.parallel.note_add(ids, params, request_id)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV; statistics keep only the steps that ran."""
        children = self._groups.pop(request_id, None)
        if children is None:
            return False
        if self._leader:
            assert self.parallel is not None
            self.parallel.note_abort(request_id)
        for child in children:
            if not child.finished:
                self.scheduler.finish(child, "abort")
            self._emitted.pop(child.request_id, None)
            if self.synthetic is not None:
                self.synthetic.release(child.request_id)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one step; return the requests that progressed (cumulative, with the new part)."""
        started = time.perf_counter()
        batch = self._schedule()
        if batch.kind == "idle":
            return []
        if batch.kind == "prefill":
            query = sum(r.num_tokens - r.num_computed for r in batch.requests)
            context = sum(r.num_tokens for r in batch.requests)
        else:
            query = len(batch.requests) * (self.k + 1)
            context = sum(r.num_tokens + self.k for r in batch.requests)
        self._draft_seconds = 0.0
        if batch.kind == "prefill":
            seconds = self._prefill(batch.requests)
        else:
            seconds = self._decode(batch.requests)
        if self.config.executor == "torch":
            seconds = time.perf_counter() - started
            if batch.kind == "decode":  # the forward was as wide as the widest request's drafts
                assert isinstance(self.executor, TorchExecutor)
                width = self.executor.last_query_width
                query = len(batch.requests) * width
                context -= len(batch.requests) * (self.k + 1 - width)
        self.clock += seconds
        self.steps.append(
            StepRecord(
                batch.kind, len(batch.requests), query, context, seconds, self._draft_seconds
            )
        )
        if len(self.steps) >= 2 * STEP_HISTORY:
            del self.steps[:STEP_HISTORY]
        return self._outputs(batch.requests)

    def _schedule(self) -> ScheduledBatch:
        """This step's batch; on a tensor-parallel rank, the same batch on every rank."""
        if self.parallel is not None:
            self.parallel.check()
        batch = self.scheduler.schedule()
        ids = [r.request_id for r in batch.requests]
        if self._leader and batch.kind != "idle":
            assert self.parallel is not None
            self.parallel.send_plan(batch.kind, ids)
        elif self._expected is not None and self._expected != (batch.kind, ids):
            assert self.parallel is not None
            raise LockstepError(
                f"rank {self.parallel.rank}: scheduled {batch.kind} {ids}, but rank 0 scheduled "
                f"{self._expected[0]} {self._expected[1]}: the ranks are out of step"
            )
        return batch

    def check_alive(self) -> None:
        """Raise ``RankDied`` when a tensor-parallel rank has ended or stopped answering (a
        no-op otherwise). Called while idle: rank 0 also checks, every ``HEARTBEAT_S``, that the
        other ranks answer (a stopped rank is then caught by the collective timeout)."""
        if self.parallel is not None:
            self.parallel.check()
            if self._leader:
                self.parallel.heartbeat()

    @property
    def failure(self) -> str | None:
        """Why a tensor-parallel engine cannot go on (a rank ended or stopped answering)."""
        return self.parallel.dead if self.parallel is not None else None

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (rank 0; a no-op otherwise). Idempotent."""
        if self._leader:
            assert self.parallel is not None
            self.parallel.close()

    def follow(self, plan: dict[str, Any]) -> None:
        """A follower rank: apply rank 0's adds and aborts, then run the step it planned."""
        for event in plan["events"]:
            if event[0] == "add":
                _, ids, params, request_id = event
                self.add_request(ids, SamplingParams(**params), request_id)
            else:
                self.abort(event[1])
        self._expected = (plan["kind"], list(plan["ids"]))
        try:
            self.step()
        finally:
            self._expected = None

    def _prefill(self, requests: list[Request]) -> float:
        if isinstance(self.drafter, DraftModelDrafter):
            self.drafter.prefill(requests)
        forward = self.executor.prefill(requests)
        for r in requests:
            r.num_computed = r.num_tokens
        if forward.logits is not None and all(r.params.greedy for r in requests):
            tokens = forward.logits.argmax(dim=-1)
        elif forward.logits is not None:
            processed = logits_ops.process(forward.logits, [r.params for r in requests])
            tokens = logits_ops.sample(processed, [r.generator for r in requests], self.generator)
        else:
            assert forward.argmax is not None
            tokens = forward.argmax
        if self.parallel is not None:  # rank 0's samples, so every rank appends the same token
            tokens = self.parallel.share_tokens(tokens)
        for r, token in zip(requests, tokens.tolist(), strict=True):
            self._append(r, [token])
        return forward.seconds

    def _decode(self, requests: list[Request]) -> float:
        batch = len(requests)
        params = [r.params for r in requests]
        greedy = all(p.greedy for p in params)
        method = "synthetic" if self.synthetic else "greedy" if greedy else "probabilistic"
        if self.drafter is not None:
            drafting = time.perf_counter()
            proposal = self._cover(requests, self._propose(requests, method == "probabilistic"))
            self._draft_seconds = proposal.seconds or time.perf_counter() - drafting
        else:
            empty = torch.zeros((batch, 0), dtype=torch.int64, device=self.device)
            proposal = Proposal(empty, torch.zeros(batch, dtype=torch.int64, device=self.device))
        num_drafts = proposal.num_tokens
        if isinstance(self.executor, TorchExecutor):
            forward = self.executor.verify(requests, proposal.token_ids, num_drafts.tolist())
        else:
            forward = self.executor.verify(requests, proposal.token_ids)
        rows = torch.arange(batch, device=self.device)
        processed = None
        if forward.logits is not None and (method == "probabilistic" or not greedy):
            processed = logits_ops.process(forward.logits, params)
            argmax = forward.logits.argmax(dim=-1)
            bonus = logits_ops.sample(
                processed[rows, num_drafts], [r.generator for r in requests], self.generator
            )
        elif forward.logits is not None:  # every request greedy: the argmax is all we need
            argmax = forward.logits.argmax(dim=-1)
            bonus = argmax[rows, num_drafts]
        else:
            assert forward.argmax is not None
            argmax = forward.argmax.to(self.device)
            bonus = argmax[rows, num_drafts]
        if method == "probabilistic" and proposal.probs is None:
            method = "greedy"  # no drafts to weigh (speculation off)
        out = rejection_sample(
            method,  # type: ignore[arg-type]
            proposal.token_ids,
            num_drafts,
            bonus,
            target_logits=processed if method == "probabilistic" else None,
            target_argmax=argmax,
            draft_probs=proposal.probs,
            synthetic=self.synthetic,
            generator=[r.generator or self.generator for r in requests],
            request_keys=[r.request_id for r in requests] if self._keyed else None,
        )
        if self.parallel is not None:
            out = self._share_sampled(out, method == "synthetic")
        emitted = out.output_token_ids.tolist()
        accepted = out.num_accepted.tolist()
        drafted = num_drafts.tolist()
        if self.parallel is not None:
            self.parallel.record(accepted)
        self.stats.record(drafted, accepted)
        for r, ids, n_acc, n_draft in zip(requests, emitted, accepted, drafted, strict=True):
            before = r.num_tokens
            r.acceptance.record(n_draft, n_acc)
            r.num_computed = before + n_acc  # rejected slots are rolled back
            if isinstance(self.drafter, DraftModelDrafter):
                self.drafter.accepted(r, before, n_acc)
            self._append(r, ids[: n_acc + 1])
        return forward.seconds + proposal.seconds

    def _cover(self, requests: list[Request], proposal: Proposal) -> Proposal:
        """Forced coverage below 1: a request-step keeps its drafts with probability coverage,
        its uniform fixed by the seed, the request id and its tokens so far (so every rank, each
        with the proposal, drops the same rows with no collective); the rest propose none."""
        coverage = self.config.speculative.draft_coverage
        if coverage >= 1 or self.synthetic is None:
            return proposal
        seed = self.config.speculative.seed ^ COVERAGE_KEY
        keep = [request_uniform(seed, f"{r.request_id}:{r.num_tokens}") < coverage
                for r in requests]  # fmt: skip
        if all(keep):
            return proposal
        mask = torch.tensor(keep, dtype=torch.int64).to(proposal.num_tokens.device)
        return Proposal(proposal.token_ids, proposal.num_tokens * mask, proposal.probs,
                        proposal.seconds)  # fmt: skip

    def _propose(self, requests: list[Request], want_probs: bool) -> Proposal:
        """The drafter's proposal; across tensor-parallel ranks rank 0's, broadcast (the
        n-gram drafter runs on rank 0 alone, a draft model on every rank's shard)."""
        assert self.drafter is not None
        parallel = self.parallel
        if parallel is None:
            return self.drafter.propose(requests, want_probs, self.device)
        local = None
        if parallel.leader or not isinstance(self.drafter, NgramDrafter):
            local = self.drafter.propose(requests, want_probs, self.device)
        packed = parallel.share_proposal(local, len(requests), self.k)
        ids, counts = packed[:, :-1], packed[:, -1]
        if local is not None:
            return Proposal(ids, counts, local.probs, local.seconds)
        probs = one_hot(ids, self.vocab_size) if want_probs else None
        return Proposal(ids, counts, probs)

    def _share_sampled(self, out: SamplerOutput, forced: bool) -> SamplerOutput:
        """Rank 0's tokens (accepted counts stay local when forced); with ``debug_lockstep``,
        the ranks' accepted counts compared. No host read unless the check is on."""
        assert self.parallel is not None
        out = self.parallel.share_sampled(out, forced)
        if self.parallel.debug_lockstep:
            self.parallel.check_lockstep(out.num_accepted)
        return out

    # ------------------------------------------------------------------ postprocess
    def _append(self, request: Request, tokens: list[int]) -> None:
        """Append emitted tokens, stopping at EOS, a stop token or string, or the length cap."""
        params = request.params
        for token in tokens:
            request.output_token_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = time.perf_counter()
            if not params.ignore_eos and token == request.eos_token_id:
                self._finish(request, "stop")
                return
            if token in request.stop_token_ids:
                self._finish(request, "stop")
                return
            if self.config.detokenize:
                new = request.decoder.push([token])
                request.text += new
                if request.stop_matcher is not None and self._cut_at_stop(request, new):
                    self._finish(request, "stop", cut=True)
                    return
            if len(request.output_token_ids) >= params.max_tokens:
                self._finish(request, "length")
                return

    def _cut_at_stop(self, request: Request, new: str) -> bool:
        """Cut the text where the earliest stop string ending in ``new`` (its newest characters)
        begins; the work is in proportion to ``new``, whatever the stop strings."""
        assert request.stop_matcher is not None
        request.stop_state, first = request.stop_matcher.feed(request.stop_state, new)
        if first is None:
            return False
        request.text = request.text[: len(request.text) - len(new) + first]
        return True

    def _finish(self, request: Request, reason: str, cut: bool = False) -> None:
        if not cut and self.config.detokenize:  # release characters held back mid-sequence
            request.text += request.decoder.flush()
        request.finish_time = time.perf_counter()
        self.scheduler.finish(request, reason)
        if self.synthetic is not None:  # its own rates, if a spread cached them
            self.synthetic.release(request.request_id)

    def _outputs(self, progressed: Sequence[Request]) -> list[RequestOutput]:
        parents = dict.fromkeys(r.parent_id for r in progressed)
        return [out for pid in parents if (out := self._group_output(pid)) is not None]

    def _group_output(self, parent_id: str) -> RequestOutput | None:
        children = self._groups.get(parent_id)
        if children is None:
            return None
        new_ids, new_text, outputs = [], [], []
        for index, child in enumerate(children):
            sent_tokens, sent_chars = self._emitted[child.request_id]
            matcher = child.stop_matcher
            hold = 0 if child.finished or matcher is None else matcher.longest - 1
            visible = max(sent_chars, len(child.text) - hold)
            new_ids.append(child.output_token_ids[sent_tokens:])
            new_text.append(child.text[sent_chars:visible])
            self._emitted[child.request_id] = (len(child.output_token_ids), visible)
            outputs.append(
                CompletionOutput(
                    index=index,
                    text=child.text[:visible],
                    token_ids=list(child.output_token_ids),
                    finish_reason=child.finish_reason,
                    acceptance=child.acceptance,
                )
            )
        finished = all(c.finished for c in children)
        if finished:
            del self._groups[parent_id]
            for child in children:
                self._emitted.pop(child.request_id, None)
        first = children[0]
        return RequestOutput(
            request_id=parent_id,
            prompt_token_ids=first.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            new_token_ids=new_ids,
            new_text=new_text,
            arrival_time=first.arrival_time,
            first_token_time=first.first_token_time,
        )

    # ------------------------------------------------------------------ offline
    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run a batch to completion; outputs in prompt order."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]
