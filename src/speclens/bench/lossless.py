"""Does a server's speculative decoding change what it generates? Compare it with a reference
that serves the same weights without speculation.

Greedy (temperature 0): speculation must be invisible, so each prompt's output must be identical
to the reference's; the first divergent token (or character) is reported.

Sampled (temperature > 0): lossless speculation (rejection sampling) keeps the target's
distribution, so both servers' samples come from one distribution. For each prompt and each
position, the unit at that position (a token id, or a character when a server gives no ids;
"<end>" once a sequence has ended) is compared between the two samples with a chi-square test
of homogeneity. Categories are pooled until every expected count is at least 5, and Bonferroni
over all tests keeps the family-wise false-alarm rate at ``alpha``. The first token is not
compared in token mode by default: it comes from the prefill, before any draft is verified.

A sampled PASS needs evidence: no test at all, or tests too weak to see the stated effect
(``min_effect``, a total variation distance, detected with 80% power), is "inconclusive".
Power: a two-sample test of distributions at total variation δ has noncentrality at least
``n_a n_b / (n_a + n_b) * 4 δ²`` whatever the shape of the difference (Cauchy-Schwarz on
Σ (p - q)² / m), so δ = sqrt(λ (n_a + n_b) / (4 n_a n_b)), with λ the noncentrality at which
the chi-square test at the Bonferroni level reaches 80% power, is detected at least that often.

Token ids come from vLLM's ``return_token_ids`` request field; a server that refuses it or
answers without ``token_ids`` is compared by characters (a decoded text is a function of the
tokens, so the test stays valid, with less power).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from speclens.bench import transport
from speclens.bench.client import (
    MAX_BODY_BYTES,
    MAX_ERROR_BYTES,
    Endpoint,
    chunk_problem,
)

Mode = Literal["tokens", "characters"]
END = "<end>"
OTHER = "<other>"
MIN_EXPECTED = 5.0  # Cochran's rule for the chi-square approximation
MIN_TESTABLE = int(2 * MIN_EXPECTED)  # samples a side before two categories can reach it
POWER = 0.8  # the detectable effect is the total variation found this often
# A gross difference, on purpose: the default run (200 samples a side, 4 prompts x positions
# 2..5) sees it at any df pooling leaves (at most 40 categories), so only a run with fewer
# samples is inconclusive for power by default; --min-effect asks for more.
DEFAULT_MIN_EFFECT = 0.4
CHARS_PER_TOKEN = 4  # characters compared per token position when a server gives no token ids
CONTEXT = 20  # characters shown each side of a greedy divergence


# ---------------------------------------------------------------------------- statistics


def gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a), for a > 0, x >= 0: the
    power series for x < a + 1, Lentz's continued fraction beyond (Numerical Recipes §6.2)."""
    if a <= 0:
        raise ValueError(f"gamma_q: a must be > 0, got {a}")
    if x <= 0:
        return 1.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_prefix) * h)


def chi2_sf(statistic: float, df: int) -> float:
    """P(X >= statistic) for X chi-square with ``df`` degrees of freedom."""
    return gamma_q(df / 2, statistic / 2)


def chi2_isf(p: float, df: int) -> float:
    """The statistic x with P(X >= x) = p for X chi-square with ``df`` degrees of freedom."""
    low, high = 0.0, 1.0
    while chi2_sf(high, df) > p:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_sf(mid, df) > p else (low, mid)
    return high


def ncx2_sf(x: float, df: int, noncentrality: float) -> float:
    """P(X >= x) for X noncentral chi-square: a Poisson(λ/2) mixture of central ones."""
    half = noncentrality / 2
    if half <= 0:
        return chi2_sf(x, df)
    terms = int(half + 12 * math.sqrt(half) + 30)
    return sum(
        math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) * gamma_q(df / 2 + j, x / 2)
        for j in range(terms)
    )


@functools.lru_cache(maxsize=256)
def noncentrality_for_power(alpha: float, df: int, power: float = POWER) -> float:
    """The noncentrality at which a level-``alpha`` chi-square test with ``df`` df rejects with
    probability ``power`` (bisection; cached: a run has few distinct (alpha, df))."""
    critical = chi2_isf(alpha, df)
    low, high = 0.0, 1.0
    while ncx2_sf(critical, df, high) < power:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if ncx2_sf(critical, df, mid) < power else (low, mid)
    return high


def detectable_tv(n_a: int, n_b: int, alpha: float, df: int, power: float = POWER) -> float:
    """The total variation distance a test of ``n_a`` against ``n_b`` samples at level ``alpha``
    with ``df`` df detects with probability at least ``power``, whatever its shape (at most 1)."""
    lam = noncentrality_for_power(alpha, df, power)
    return min(1.0, math.sqrt(lam * (n_a + n_b) / (4 * n_a * n_b)))


def samples_for_effect(tv: float, alpha: float, df: int, power: float = POWER) -> int:
    """Samples a side for ``detectable_tv`` to reach ``tv`` (never below ``MIN_TESTABLE``)."""
    lam = noncentrality_for_power(alpha, df, power)
    return max(MIN_TESTABLE, math.ceil(lam / (2 * tv * tv) - 1e-9))


@dataclass
class Homogeneity:
    """A two-sample chi-square test of homogeneity on one position's categories."""

    statistic: float
    df: int
    p_value: float
    categories: int  # after pooling
    counts: dict[str, list[int]]  # category -> [server, reference], the largest few

    @property
    def tested(self) -> bool:
        return self.df > 0


def pooled(a: Counter[Hashable], b: Counter[Hashable]) -> list[tuple[str, int, int]]:
    """Categories as (label, count in a, count in b), the rarest pooled into ``<other>`` until
    every expected count is at least ``MIN_EXPECTED`` (or one category is left)."""
    na, nb = sum(a.values()), sum(b.values())
    n = na + nb
    cells = sorted(
        ((repr(k) if not isinstance(k, str) else k, a[k], b[k]) for k in set(a) | set(b)),
        key=lambda c: (c[1] + c[2], c[0]),
        reverse=True,
    )

    def enough(total: int) -> bool:
        return total * min(na, nb) >= MIN_EXPECTED * n

    other = (0, 0)
    while cells and not enough(cells[-1][1] + cells[-1][2]):
        _, x, y = cells.pop()
        other = (other[0] + x, other[1] + y)
    if sum(other):
        if cells and not enough(sum(other)):  # too small alone: join the rarest kept category
            _, x, y = cells.pop()
            other = (other[0] + x, other[1] + y)
        cells.append((OTHER, *other))
    return cells


def homogeneity(a: Sequence[Hashable], b: Sequence[Hashable], shown: int = 5) -> Homogeneity:
    """Chi-square test that ``a`` and ``b`` are draws from one categorical distribution."""
    cells = pooled(Counter(a), Counter(b))
    na, nb = len(a), len(b)
    n = na + nb
    counts = {label: [x, y] for label, x, y in cells[:shown]}
    if len(cells) < 2 or na == 0 or nb == 0:
        return Homogeneity(0.0, 0, 1.0, len(cells), counts)
    statistic = 0.0
    for _, x, y in cells:
        total = x + y
        for observed, row in ((x, na), (y, nb)):
            expected = row * total / n
            statistic += (observed - expected) ** 2 / expected
    df = len(cells) - 1
    return Homogeneity(statistic, df, chi2_sf(statistic, df), len(cells), counts)


# ---------------------------------------------------------------------------- HTTP


@dataclass
class Target:
    url: str
    model: str
    api_key: str | None = None


@dataclass
class Sample:
    """One completion: its text, its token ids when the server gave them, or why it failed."""

    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    error: str | None = None


def _body(
    target: Target,
    endpoint: Endpoint,
    prompt: str,
    temperature: float,
    max_tokens: int,
    seed: int,
    top_k: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "seed": seed,
        "return_token_ids": True,
    }
    if top_k is not None:
        body["top_k"] = top_k
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def parse_sample(raw: bytes, endpoint: Endpoint) -> Sample:
    """The first choice of a non-streamed body, every field type-checked; never raises."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Sample(error=f"the response is not JSON: {exc}")
    problem = chunk_problem(data)
    choices = data.get("choices") if isinstance(data, dict) else None
    if problem or not isinstance(choices, list) or not choices:
        return Sample(error=f"the response holds no choice ({problem or 'choices is empty'})")
    choice = choices[0]
    if endpoint == "chat":
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        return Sample(error="the first choice holds no text")
    ids = choice.get("token_ids")
    valid = isinstance(ids, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    )
    reason = choice.get("finish_reason")
    return Sample(text, list(ids) if valid else None, reason if isinstance(reason, str) else None)


class Sampler:
    """Sends single-choice, non-streamed requests to one server, at most ``concurrency`` at once.

    The first answer decides whether the server takes ``return_token_ids``: on a 400 the request
    is sent again without it, and so are all later ones."""

    def __init__(
        self,
        target: Target,
        endpoint: Endpoint,
        session: aiohttp.ClientSession,
        concurrency: int,
    ) -> None:
        self.target = target
        self.endpoint = endpoint
        self.session = session
        self.limit = asyncio.Semaphore(concurrency)
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        self.url = target.url.rstrip("/") + path
        self.headers = {"Content-Type": "application/json"}
        if target.api_key:
            self.headers["Authorization"] = f"Bearer {target.api_key}"
        self.ask_ids = True
        self._probe = asyncio.Lock()
        self._probed = False

    async def _post(self, body: dict[str, Any]) -> tuple[int, bytes]:
        """One request, as the bench client sends it: no redirect followed, sent again when the
        server never received it (the same seed asks for the same sample, so a resend biases
        nothing), the body decoded within its bound. Status 0 carries a failure's message."""
        resp = await transport.post(self.session, self.url, orjson.dumps(body), self.headers)
        async with resp:
            problem = transport.redirect_problem(resp)
            if problem:
                return 0, problem.encode()
            limit = MAX_BODY_BYTES if resp.status == 200 else MAX_ERROR_BYTES
            try:
                raw, longer = await transport.read_at_most(resp, limit)
            except transport.BodyError as exc:
                return 0, str(exc).encode()
            if longer and resp.status == 200:
                return 0, f"the response body exceeds {MAX_BODY_BYTES} bytes".encode()
            return resp.status, raw

    async def _one(self, body: dict[str, Any]) -> Sample:
        if not self.ask_ids:
            body.pop("return_token_ids", None)
        status, raw = await self._post(body)
        if status == 400 and "return_token_ids" in body:
            body.pop("return_token_ids")
            retry_status, retry_raw = await self._post(body)
            if retry_status == 200:
                self.ask_ids = False
            status, raw = retry_status, retry_raw
        if status != 200:
            text = raw.decode("utf-8", errors="replace")[:500]
            return Sample(error=f"HTTP {status}: {text}" if status else text)
        return parse_sample(raw, self.endpoint)

    async def sample(
        self,
        prompt: str,
        temperature: float,
        max_tokens: int,
        seed: int,
        top_k: int | None = None,
    ) -> Sample:
        body = _body(self.target, self.endpoint, prompt, temperature, max_tokens, seed, top_k)
        async with self.limit:
            try:
                if not self._probed:  # the first request alone finds out about return_token_ids
                    async with self._probe:
                        if not self._probed:
                            out = await self._one(body)
                            self._probed = out.error is None
                            return out
                return await self._one(body)
            except (aiohttp.ClientError, TimeoutError) as exc:
                return Sample(error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------- the check


Verdict = Literal["pass", "flagged", "inconclusive"]


@dataclass
class LosslessConfig:
    server: Target
    reference: Target
    prompts: list[str]
    endpoint: Endpoint = "completions"
    temperature: float = 0.0
    samples: int = 200
    max_tokens: int = 32
    alpha: float = 0.01
    tolerance: float = 0.0  # greedy: share of prompts allowed to differ
    top_k: int | None = None  # sent only when given (sampled: concentrates a flat distribution)
    seed: int = 0
    concurrency: int = 16
    timeout: float = 600.0
    positions: list[int] | None = None  # sampled: 1-based token positions (default 2..max_tokens)
    min_effect: float = DEFAULT_MIN_EFFECT  # sampled: the total variation the test must detect


@dataclass
class Divergence:
    """Where a greedy output first differs from the reference's."""

    prompt: int
    mode: Mode
    index: int  # token or character index
    server: str  # the unit there (token id or character), "<end>" past the end
    reference: str
    char_index: int
    server_context: str
    reference_context: str


@dataclass
class PositionTest:
    prompt: int
    position: int  # 1-based token position, or 0-based character index in character mode
    statistic: float
    df: int
    p_value: float
    counts: dict[str, list[int]]


@dataclass
class LosslessReport:
    mode: Mode
    temperature: float
    compared: str  # one sentence: what was compared
    prompts: int
    samples: int  # per prompt and server
    passed: bool
    verdict: Verdict = "inconclusive"
    reason: str = ""  # why the verdict, with the evidence it rests on
    failed_requests: int = 0
    errors: list[str] = field(default_factory=list)  # the first few
    # greedy
    identical: int = 0
    identical_share: float = 0.0
    tolerance: float = 0.0
    divergences: list[Divergence] = field(default_factory=list)
    # sampled
    alpha: float = 0.0
    positions: list[int] = field(default_factory=list)  # as shown (1-based tokens, 0-based chars)
    tests: int = 0
    untested_single: int = 0  # prompt positions that showed one unit, the same on both sides
    untested_pooled: int = 0  # prompt positions whose units pooled into one category
    statistic: float | None = None  # of the most significant test
    df: int | None = None
    min_p_value: float | None = None
    p_value: float | None = None  # Bonferroni-adjusted: min(1, tests x min p)
    worst: PositionTest | None = None
    min_effect: float | None = None
    detectable_tv: float | None = None  # the weakest test's, at 80% power
    samples_needed: int | None = None  # a side, for every test to detect min_effect

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mode(*groups: list[Sample]) -> Mode:
    ok = [s for group in groups for s in group if s.error is None]
    return "tokens" if ok and all(s.token_ids is not None for s in ok) else "characters"


def _units(sample: Sample, mode: Mode) -> Sequence[Hashable]:
    if mode == "tokens":
        assert sample.token_ids is not None
        return sample.token_ids
    return sample.text


def _show(unit: Hashable) -> str:
    return unit if isinstance(unit, str) else str(unit)


def first_divergence(index: int, a: Sample, b: Sample, mode: Mode) -> Divergence | None:
    """Where ``a`` first differs from ``b`` (None when they are identical)."""
    ua, ub = _units(a, mode), _units(b, mode)
    common = next((i for i, (x, y) in enumerate(zip(ua, ub, strict=False)) if x != y), None)
    if common is None:
        if len(ua) == len(ub):
            return None
        common = min(len(ua), len(ub))
    at = next(
        (i for i, (x, y) in enumerate(zip(a.text, b.text, strict=False)) if x != y),
        min(len(a.text), len(b.text)),
    )

    def unit(u: Sequence[Hashable]) -> str:
        return _show(u[common]) if common < len(u) else END

    def around(text: str) -> str:
        return text[max(0, at - CONTEXT) : at + CONTEXT]

    return Divergence(index, mode, common, unit(ua), unit(ub), at, around(a.text), around(b.text))


def position_units(
    samples: list[Sample], mode: Mode, positions: Sequence[int]
) -> list[list[Hashable]]:
    """For each position, every sample's unit there ("<end>" past the end)."""
    out: list[list[Hashable]] = []
    for p in positions:
        column: list[Hashable] = []
        for s in samples:
            units = _units(s, mode)
            column.append(units[p] if p < len(units) else END)
        out.append(column)
    return out


async def _collect(
    config: LosslessConfig, on_done: Callable[[], None] | None
) -> tuple[list[list[Sample]], list[list[Sample]]]:
    """Each prompt's samples from the server and from the reference, in seed order."""
    greedy = config.temperature == 0
    n = 1 if greedy else config.samples
    async with transport.session(config.timeout) as session:
        sides = [
            Sampler(t, config.endpoint, session, config.concurrency)
            for t in (config.server, config.reference)
        ]

        async def one(side: Sampler, prompt: str, seed: int) -> Sample:
            out = await side.sample(
                prompt, config.temperature, config.max_tokens, seed, config.top_k
            )
            if on_done is not None:
                on_done()
            return out

        tasks = []
        for p, prompt in enumerate(config.prompts):
            for s, side in enumerate(sides):
                # Distinct seeds everywhere: the two samples must be independent.
                base = config.seed + (2 * p + s) * n
                tasks.append(asyncio.gather(*(one(side, prompt, base + i) for i in range(n))))
        results = await asyncio.gather(*tasks)
    server = [list(results[2 * p]) for p in range(len(config.prompts))]
    reference = [list(results[2 * p + 1]) for p in range(len(config.prompts))]
    return server, reference


def run_lossless(
    config: LosslessConfig, on_done: Callable[[], None] | None = None
) -> LosslessReport:
    """Sample both servers and judge; ``on_done`` is called after every request."""
    server, reference = asyncio.run(_collect(config, on_done))
    return judge(config, server, reference)


def judge(
    config: LosslessConfig, server: list[list[Sample]], reference: list[list[Sample]]
) -> LosslessReport:
    """The verdict on samples already collected (``server[p]``, ``reference[p]``: prompt p's)."""
    failed = [
        f"{side} prompt {p} sample {i}: {s.error}"
        for side, groups in (("server", server), ("reference", reference))
        for p, group in enumerate(groups)
        for i, s in enumerate(group)
        if s.error is not None
    ]
    mode = _mode(*server, *reference)
    greedy = config.temperature == 0
    report = LosslessReport(
        mode=mode,
        temperature=config.temperature,
        compared="",
        prompts=len(config.prompts),
        samples=1 if greedy else config.samples,
        passed=False,
        failed_requests=len(failed),
        errors=failed[:5],
    )
    if greedy:
        _judge_greedy(config, server, reference, report)
    else:
        _judge_sampled(config, server, reference, report)
    if failed:
        report.passed = False
        report.verdict = "inconclusive"
        report.reason = f"{len(failed)} requests failed: no verdict; " + report.reason
    return report


def _judge_greedy(
    config: LosslessConfig,
    server: list[list[Sample]],
    reference: list[list[Sample]],
    report: LosslessReport,
) -> None:
    unit = "token" if report.mode == "tokens" else "character"
    report.compared = (
        f"greedy outputs ({config.max_tokens} max tokens), {unit} by {unit}, of "
        f"{len(config.prompts)} prompts against the reference"
    )
    report.tolerance = config.tolerance
    pairs = [
        (p, a[0], b[0])
        for p, (a, b) in enumerate(zip(server, reference, strict=True))
        if a[0].error is None and b[0].error is None
    ]
    for p, a, b in pairs:
        divergence = first_divergence(p, a, b, report.mode)
        if divergence is None:
            report.identical += 1
        else:
            report.divergences.append(divergence)
    report.identical_share = report.identical / len(pairs) if pairs else 0.0
    evidence = f"{report.identical} of {len(pairs)} prompts identical"
    if not pairs:
        report.verdict, report.reason = "inconclusive", "no prompt got an answer from both sides"
    elif 1 - report.identical_share <= config.tolerance + 1e-12:
        report.verdict, report.reason = "pass", evidence
    else:
        report.verdict = "flagged"
        report.reason = f"{evidence}, tolerance {100 * config.tolerance:g}% differ"
    report.passed = report.verdict == "pass"


def compared_positions(config: LosslessConfig, mode: Mode) -> list[int]:
    """The 0-based unit indices compared: token positions 2..M (or ``config.positions``); in
    character mode, the ``CHARS_PER_TOKEN`` characters each token position stands for."""
    tokens = config.positions or list(range(2, config.max_tokens + 1))
    if mode == "tokens":
        return [t - 1 for t in tokens]
    if config.positions is None:
        return list(range(CHARS_PER_TOKEN * config.max_tokens))
    return [CHARS_PER_TOKEN * (t - 1) + c for t in tokens for c in range(CHARS_PER_TOKEN)]


def _judge_sampled(
    config: LosslessConfig,
    server: list[list[Sample]],
    reference: list[list[Sample]],
    report: LosslessReport,
) -> None:
    mode = report.mode
    unit = "token" if mode == "tokens" else "character"
    positions = compared_positions(config, mode)
    report.positions = [i + 1 if mode == "tokens" else i for i in positions]
    report.compared = (
        f"the {unit} at each of {_span(report.positions)} ({len(positions)} per prompt) of "
        f"{config.samples} samples per prompt and server at temperature {config.temperature:g}: "
        f"chi-square homogeneity, Bonferroni over the tests, family-wise alpha {config.alpha:g}"
    )
    report.alpha = config.alpha
    report.min_effect = config.min_effect
    tests: list[PositionTest] = []
    sizes: list[tuple[int, int, int]] = []  # (n_a, n_b, df) of each test
    for p, (mine, theirs) in enumerate(zip(server, reference, strict=True)):
        ok_a = [s for s in mine if s.error is None]
        ok_b = [s for s in theirs if s.error is None]
        columns = zip(
            position_units(ok_a, mode, positions),
            position_units(ok_b, mode, positions),
            strict=True,
        )
        for position, (ua, ub) in zip(positions, columns, strict=True):
            result = homogeneity(ua, ub)
            if result.tested:
                shown = position + 1 if mode == "tokens" else position
                tests.append(
                    PositionTest(
                        p, shown, result.statistic, result.df, result.p_value, result.counts
                    )
                )
                sizes.append((len(ua), len(ub), result.df))
            elif ua and ub and set(ua) == set(ub) and len(set(ua)) == 1:
                report.untested_single += 1
            else:
                report.untested_pooled += 1
    report.tests = len(tests)
    if tests:
        worst = min(tests, key=lambda t: t.p_value)
        report.worst = worst
        report.statistic, report.df = worst.statistic, worst.df
        report.min_p_value = worst.p_value
        report.p_value = min(1.0, worst.p_value * len(tests))
        level = config.alpha / len(tests)
        report.detectable_tv = max(detectable_tv(a, b, level, df) for a, b, df in sizes)
        report.samples_needed = max(
            samples_for_effect(config.min_effect, level, df) for _, _, df in sizes
        )
    report.verdict, report.reason = _sampled_verdict(config, report, len(server))
    report.passed = report.verdict == "pass"


def _span(shown: list[int]) -> str:
    """Positions as a short phrase: "positions 2..5", or the list when not contiguous."""
    if not shown:
        return "no positions"
    if shown == list(range(shown[0], shown[-1] + 1)):
        return f"positions {shown[0]}..{shown[-1]}"
    return "positions " + ",".join(map(str, shown))


def _sampled_verdict(
    config: LosslessConfig, report: LosslessReport, prompts: int
) -> tuple[Verdict, str]:
    """Flagged on a significant difference; otherwise a pass only when the tests that ran could
    have seen ``min_effect``; else inconclusive, saying why."""
    if report.tests == 0:
        return "inconclusive", _no_test_reason(config, report, prompts)
    assert report.p_value is not None and report.detectable_tv is not None
    evidence = (
        f"{report.tests} tests over {prompts} prompts x {config.samples} samples a side; "
        f"Bonferroni p {report.p_value:.3g}"
    )
    if report.p_value < config.alpha:
        return "flagged", f"{evidence} < alpha {config.alpha:g}"
    power = (
        f"each test detects a total variation of {report.detectable_tv:.3g} with {POWER:.0%} power"
    )
    if report.detectable_tv > config.min_effect + 1e-12:
        return "inconclusive", (
            f"{evidence} >= alpha {config.alpha:g}, but too few samples: {power}, above "
            f"--min-effect {config.min_effect:g} (needs --samples {report.samples_needed})"
        )
    return "pass", f"{evidence} >= alpha {config.alpha:g}; {power}"


def _no_test_reason(config: LosslessConfig, report: LosslessReport, prompts: int) -> str:
    """Why no position could be tested, in terms that are true of these samples."""
    if config.samples < MIN_TESTABLE:
        return (
            f"no test can run on {config.samples} samples a side: a test needs two categories "
            f"of expected count >= {MIN_EXPECTED:g}, so at least {MIN_TESTABLE} samples a side"
        )
    parts = []
    if report.untested_pooled:
        parts.append(
            f"{report.untested_pooled} held units too rare to reach an expected count of "
            f"{MIN_EXPECTED:g}, pooled into one category (a flat distribution: raise --samples, "
            "give --top-k, or use prompts whose continuations repeat)"
        )
    if report.untested_single:
        parts.append(
            f"{report.untested_single} held one unit, the same on both sides (no variation to test)"
        )
    total = report.untested_single + report.untested_pooled
    return f"no test ran: of {total} prompt positions ({prompts} prompts), " + "; ".join(
        parts or ["none had samples"]
    )
