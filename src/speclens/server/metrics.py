"""``GET /metrics``: Prometheus text, with ATOM's and vLLM's speculative-decoding names.

Counters of acceptance are read from the engine's statistics at scrape time (one source of
truth, so ``/metrics`` always agrees with ``/debug/mtp_stats``); serving figures (tokens, TTFT,
inter-token latency, end-to-end latency) are observed as outputs stream, and so is each finished
request's own realized AL (``speclens:request_acceptance_length``: the spread between requests).

Every ``vllm:`` family is labelled as vLLM 0.32 labels it (``vllm/v1/metrics/loggers.py``,
``PrometheusStatLogger``: ``labelnames = ["model_name", "engine"]``, the engine index as a string;
one engine here, so ``engine="0"``). ``atom:`` and ``speclens:`` families carry ``model_name``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from speclens.engine import RequestOutput
from speclens.server.runner import EngineRunner

#: vLLM's label names for its families, in its order, and this server's one engine index.
VLLM_LABELS = ["model_name", "engine"]
ENGINE_INDEX = "0"

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


def acceptance_length_buckets(num_spec_tokens: int) -> tuple[float, ...]:
    """``le`` bounds over [1, K + 1] for a request's AL: 0.25 wide up to K 8, then as wide as
    keeps about 32 of them (an AL a request realizes is a mean, so any value in range occurs)."""
    width = 0.25 * math.ceil(num_spec_tokens / 8)
    count = math.ceil(num_spec_tokens / width)
    return tuple(min(1.0 + j * width, num_spec_tokens + 1.0) for j in range(count + 1))


class _SpecDecodeCollector(Collector):
    def __init__(self, runner: EngineRunner, model_name: str) -> None:
        self.runner = runner
        self.model_name = model_name
        self.forced = runner.engine.config.speculative.forced_acceptance_length

    def collect(self) -> Iterator[Metric]:
        snap = self.runner.snapshot()
        stats = snap.stats
        own = (["model_name"], [self.model_name])
        vllm = (VLLM_LABELS, [self.model_name, ENGINE_INDEX])

        def labelled(name: str) -> tuple[list[str], list[str]]:
            return vllm if name.startswith("vllm:") else own

        def counter(name: str, doc: str, amount: float) -> CounterMetricFamily:
            labels, value = labelled(name)
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(value, amount)
            return family

        def gauge(name: str, doc: str, amount: float) -> GaugeMetricFamily:
            labels, value = labelled(name)
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(value, amount)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the running batch.", snap.num_running)
        yield gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", snap.num_waiting
        )
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", snap.kv_usage)
        # No engine names this count; with vllm:spec_decode_num_drafts it gives draft coverage.
        yield counter(
            "speclens:decode_steps",
            "Decode steps (request-steps after prefill), drafted or not.",
            stats.num_decode_steps,
        )
        if not stats.enabled:
            return
        # No engine publishes the AL it was told to replay: a dashboard draws its target from this.
        if self.forced is not None:
            yield gauge(
                "speclens:spec_decode_forced_acceptance_length",
                "The acceptance length forced (--spec-decode-acceptance-length or its rates).",
                self.forced,
            )
        # vLLM's counters: an InferenceX-style collector measures AL = 1 + d(accepted) / d(drafts).
        yield counter(
            "vllm:spec_decode_num_drafts",
            "Verify steps (request-steps with drafts).",
            stats.num_drafts,
        )
        yield counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", stats.num_draft_tokens
        )
        yield counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Draft tokens accepted.",
            stats.num_accepted_tokens,
        )
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by position (0-based).",
            labels=[*vllm[0], "position"],
        )
        for position, count in enumerate(stats.accepted_per_position):
            per_pos.add_metric([*vllm[1], str(position)], count)
        yield per_pos
        # ATOM's names, the same numbers /debug/mtp_stats reports.
        mtp = stats.mtp_stats()
        yield gauge(
            "atom:mtp_average_tokens_per_forward",
            "Realized acceptance length (0 before any verify step).",
            mtp["average_tokens_per_forward"],
        )
        yield gauge(
            "atom:mtp_acceptance_rate", "Accepted over drafted tokens.", mtp["acceptance_rate"]
        )
        yield counter(
            "atom:mtp_accepted_tokens", "Draft tokens accepted.", stats.num_accepted_tokens
        )
        yield counter("atom:mtp_draft_tokens", "Draft tokens proposed.", stats.num_draft_tokens)
        steps = CounterMetricFamily(
            "atom:mtp_decode_steps",
            "Verify steps by accepted draft tokens.",
            labels=[*own[0], "accepted_tokens"],
        )
        # Dense over 0..K, zeros included, as ATOM's exporter (a series exists from the start).
        counts = stats.histogram.counts
        for accepted in sorted(set(range(stats.num_spec_tokens + 1)) | set(counts)):
            steps.add_metric([*own[1], str(accepted)], counts.get(accepted, 0))
        yield steps


class ServerMetrics:
    """The registry behind ``/metrics``, and the serving figures observed as outputs stream."""

    def __init__(self, runner: EngineRunner, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_SpecDecodeCollector(runner, model_name))
        labels = VLLM_LABELS
        self.model_name = model_name
        self.values = (model_name, ENGINE_INDEX)
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefilled prompt tokens.", labels, registry=self.registry
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens.", labels, registry=self.registry
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", labels,
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency (per token).", labels,
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        k = runner.engine.k
        #: One observation per finished request with a verify step: its own realized AL.
        self.request_al: Histogram | None = None
        if k:
            self.request_al = Histogram(
                "speclens:request_acceptance_length",
                "Each finished request's realized acceptance length (its tokens per verify step).",
                ["model_name"], buckets=acceptance_length_buckets(k), registry=self.registry,
            )  # fmt: skip
        self._last: dict[str, float] = {}
        runner.listeners.append(self.observe)

    def observe(self, out: RequestOutput, now: float) -> None:
        """Called on the engine thread for every output."""
        values = self.values
        new = sum(len(ids) for ids in out.new_token_ids)
        last = self._last.get(out.request_id)
        if last is None:
            self.prompt_tokens.labels(*values).inc(out.prompt_tokens)
            if out.first_token_time is not None:
                self.ttft.labels(*values).observe(out.first_token_time - out.arrival_time)
        elif new:
            gap = (now - last) / new
            for _ in range(new):
                self.itl.labels(*values).observe(gap)
        self.generation_tokens.labels(*values).inc(new)
        self._last[out.request_id] = now
        if out.finished:
            self._last.pop(out.request_id, None)
            self.e2e.labels(*values).observe(now - out.arrival_time)
            for choice in out.outputs:
                self.request_success.labels(*values, choice.finish_reason or "abort").inc()
                acceptance = choice.acceptance
                if self.request_al is not None and acceptance.num_spec_steps:
                    self.request_al.labels(self.model_name).observe(
                        acceptance.mean_acceptance_length
                    )
