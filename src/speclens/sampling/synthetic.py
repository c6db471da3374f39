"""Forced acceptance: accept/reject decisions drawn from a resolved per-position schedule.

The sampler walks draft positions in order and stops at the first rejection, so it draws against
the conditional rates c_i = r_i / r_(i-1), computed once and cached per device. Its uniforms come
from a dedicated generator on the device, re-seeded every step with ``stream_seed(step)`` (``step``
advances once per step): every tensor-parallel rank that runs the same steps draws the
same Philox stream, with no host-side draw, no host-to-device copy and no synchronisation.

With a spread between requests (``spread``: per-request AL quantiles), each request draws its own
AL once, from the seed and its key (``acceptance.spread.request_uniform``: every rank knows the
request id, so every rank draws the same), and its own schedule at that AL. The step's uniforms
stay the one lockstep stream; each row is compared with its own request's conditional rates,
copied to the device once per request and dropped when the request ends (``release``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speclens.acceptance import (
    ValidationError,
    check_rates,
    conditional_rates,
    length_from_rate,
    length_from_rates,
    minimum_variance_rates,
)
from speclens.acceptance.spread import RequestDraw, request_rates, request_uniform


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _canonical(device: torch.device | str) -> torch.device:
    """``cuda`` and ``cuda:0`` are one device: key caches by an explicit index."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class SyntheticAcceptance:
    """A forced-acceptance schedule plus its lockstep random stream.

    ``rates`` are the unconditional per-position rates r_1..r_K (any valid non-increasing
    schedule); an unreachable schedule is refused with ``speclens.acceptance.ValidationError``.
    ``spread``: per-request AL quantiles at ``acceptance.spread.LEVELS`` (None: every request
    gets ``rates``); ``derived``: ``rates`` are the minimum-variance schedule of their AL, so a
    request's own schedule is the minimum-variance one at its AL too (else ``rates``' shape).
    """

    def __init__(
        self,
        rates: Sequence[float],
        seed: int = 0,
        spread: Sequence[float] | None = None,
        derived: bool = True,
        coverage: float = 1.0,
    ) -> None:
        self.rates: list[float] = check_rates(rates)
        if not self.rates:
            raise ValidationError.single(
                "per_position_rates", "needs at least one position (K >= 1)"
            )
        self.conditional: list[float] = conditional_rates(self.rates)
        self._seed = int(seed)
        self._base = _splitmix64(self._seed)
        #: Steps drawn so far; the next draw re-seeds with ``stream_seed(step)``.
        self.step = 0
        self._conditional_on: dict[torch.device, torch.Tensor] = {}
        self._generators: dict[torch.device, torch.Generator] = {}
        self._prepared: dict[
            tuple[torch.device | str, int], tuple[torch.Generator, torch.Tensor]
        ] = {}
        #: Each request's own AL, drawn from the spread (None: one schedule for all).
        self.spread: RequestDraw | None = None
        if spread is not None:
            self.spread = RequestDraw(
                spread, length_from_rates(self.rates), len(self.rates), coverage
            )
        self.derived = bool(derived)
        #: A live request's conditional rates on the device (dropped by ``release``).
        self._rows: dict[str, torch.Tensor] = {}
        #: The last batch's stacked rows: a decode batch often repeats step after step.
        self._batch: tuple[tuple[tuple[str, ...], int, torch.device], torch.Tensor] | None = None

    @classmethod
    def from_length(cls, length: float, k: int, seed: int = 0) -> SyntheticAcceptance:
        """The minimum-variance schedule for a mean acceptance length over K positions."""
        return cls(minimum_variance_rates(length, k), seed)

    @classmethod
    def from_rate(cls, rate: float, k: int, seed: int = 0) -> SyntheticAcceptance:
        """The same schedule, spelled as an acceptance rate: length = 1 + K * rate."""
        return cls.from_length(length_from_rate(rate, k), k, seed)

    @property
    def seed(self) -> int:
        """The base seed (fixed at construction: every rank must agree on it)."""
        return self._seed

    def stream_seed(self, step: int) -> int:
        """The generator seed of ``step``: a base derived from ``seed`` plus the step, modulo
        2**32 (the CPU generator keeps 32 bits). The base is ``seed`` scrambled (splitmix64), so
        neighbouring seeds start far apart instead of sharing draws one step out of phase."""
        return (self._base + step) & 0xFFFFFFFF

    @property
    def num_spec_tokens(self) -> int:
        return len(self.rates)

    @property
    def acceptance_length(self) -> float:
        return length_from_rates(self.rates)

    def conditional_on(self, device: torch.device | str) -> torch.Tensor:
        """The conditional rates as a float32 tensor on ``device`` (copied there once)."""
        device = _canonical(device)
        cached = self._conditional_on.get(device)
        if cached is None:
            cached = torch.tensor(self.conditional, dtype=torch.float32, device=device)
            self._conditional_on[device] = cached
        return cached

    def request_al(self, key: str) -> float:
        """The AL the request ``key`` is forced to: its own draw from the spread, or the
        schedule's AL without one."""
        if self.spread is None:
            return self.acceptance_length
        return self.spread.al(request_uniform(self._seed, key))

    def request_rates(self, key: str) -> list[float]:
        """The request's own per-position rates r_1..r_K (``rates`` without a spread)."""
        if self.spread is None:
            return list(self.rates)
        return request_rates(self.request_al(key), self.rates, self.derived)

    def release(self, key: str) -> None:
        """Forget a finished request's cached rates (a no-op for one never seen)."""
        self._rows.pop(key, None)

    @property
    def num_cached(self) -> int:
        """Requests whose rates are cached: the live ones, so memory stays bounded."""
        return len(self._rows)

    def _copy_rows(self, keys: Sequence[str], device: torch.device) -> None:
        """Cache the rows of ``keys`` (new requests) on ``device`` in one copy. To an
        accelerator the copy leaves from pinned memory without blocking, so a new request never
        makes the host wait for the steps queued before it; each row is then cloned on the device
        (its own storage, freed when its request ends)."""
        host = torch.tensor(
            [conditional_rates(self.request_rates(key)) for key in keys], dtype=torch.float32
        )
        if device.type == "cuda":
            block = host.pin_memory().to(device, non_blocking=True)
        else:
            block = host.to(device)
        for key, row in zip(keys, block, strict=True):
            self._rows[key] = row.clone()

    def rows(self, keys: Sequence[str], width: int, device: torch.device | str) -> torch.Tensor:
        """The conditional rates of each request in ``keys``, [len(keys), width], on
        ``device``; copied there once per request and stacked once per new batch, never read
        back."""
        canonical = _canonical(device)
        tag = (tuple(keys), width, canonical)
        if self._batch is not None and self._batch[0] == tag:
            return self._batch[1]
        new = [
            key
            for key in dict.fromkeys(keys)
            if key not in self._rows or self._rows[key].device != canonical
        ]
        if new:
            self._copy_rows(new, canonical)
        stacked = torch.stack([self._rows[key][:width] for key in keys])
        self._batch = (tag, stacked)
        return stacked

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            self._generators[device] = gen
        return gen

    def accept(
        self,
        batch: int,
        width: int,
        device: torch.device | str,
        keys: Sequence[str] | None = None,
    ) -> torch.Tensor:
        """This step's accept decisions, [batch, width] bool: position i accepted with c_i.

        ``keys``: the batch's request ids, row by row; with a spread each row is compared with
        its own request's rates (the uniforms are the same either way). Advances the step counter
        once. Positions are independent draws here; stopping at the first rejection (and never
        accepting a padded draft) is the caller's job.
        """
        prepared = self._prepared.get((device, width))
        if prepared is None:
            prepared = self._prepare(device, width)
        generator, conditional = prepared
        uniforms = self._uniforms(generator, batch, width)
        self.step += 1
        return uniforms < self.conditional_for(conditional, batch, width, device, keys)

    def _uniforms(self, generator: torch.Generator, batch: int, width: int) -> torch.Tensor:
        """This step's uniforms, [batch, width]: the lockstep stream re-seeded for the step."""
        generator.manual_seed(self.stream_seed(self.step))
        return torch.rand((batch, width), generator=generator, device=generator.device)

    def conditional_for(
        self,
        shared: torch.Tensor,
        batch: int,
        width: int,
        device: torch.device | str,
        keys: Sequence[str] | None,
    ) -> torch.Tensor:
        """What a step's uniforms are compared with: ``shared`` (the schedule's conditional
        rates, [width]) without a spread, else each request's own rows, [batch, width]."""
        if self.spread is None or keys is None or batch == 0:
            return shared
        if len(keys) != batch:
            raise ValueError(f"{len(keys)} request keys for a batch of {batch}")
        return self.rows(keys, width, device)

    def _prepare(
        self, device: torch.device | str, width: int
    ) -> tuple[torch.Generator, torch.Tensor]:
        """The generator and conditional rates for drafts ``width`` wide on ``device`` (once)."""
        if width > self.num_spec_tokens:
            raise ValueError(
                f"drafts are {width} wide, but the schedule covers {self.num_spec_tokens} positions"
            )
        canonical = _canonical(device)
        prepared = (self._generator(canonical), self.conditional_on(canonical)[:width])
        self._prepared[(device, width)] = prepared
        return prepared
