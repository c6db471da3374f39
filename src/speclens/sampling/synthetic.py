"""Forced acceptance: accept/reject decisions drawn from a resolved per-position schedule.

The sampler walks draft positions in order and stops at the first rejection, so it draws against
the conditional rates c_i = r_i / r_(i-1), computed once and cached per device. Its uniforms come
from a dedicated generator on the device, re-seeded every step with ``stream_seed(step)`` (``step``
advances once per step): every tensor-parallel rank that runs the same steps draws the
same Philox stream, with no host-side draw, no host-to-device copy and no synchronisation.
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
    """

    def __init__(self, rates: Sequence[float], seed: int = 0) -> None:
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

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            self._generators[device] = gen
        return gen

    def accept(self, batch: int, width: int, device: torch.device | str) -> torch.Tensor:
        """This step's accept decisions, [batch, width] bool: position i accepted with c_i.

        Advances the step counter once. Positions are independent draws here; stopping at the
        first rejection (and never accepting a padded draft) is the caller's job.
        """
        prepared = self._prepared.get((device, width))
        if prepared is None:
            prepared = self._prepare(device, width)
        generator, conditional = prepared
        generator.manual_seed(self.stream_seed(self.step))
        self.step += 1
        return (
            torch.rand((batch, width), generator=generator, device=generator.device) < conditional
        )

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
