"""``speclens demo``: the main job, on the embedded default.

A worked resolution against the shipped registry: the golden AL Kimi-K3 with DSpark replays at
K = 7, thinking on, coding, its per-position rates and where they came from.
"""

from __future__ import annotations

import typer

from speclens.acceptance import (
    Registry,
    WorkloadAcceptance,
    conditional_rates,
    resolve,
)
from speclens.cli._common import out_console, reported
from speclens.cli.profiles import print_resolution


def demo(
    model: str = typer.Option("kimi-k3", "--model", help="The catalog model to resolve."),
    method: str = typer.Option("dspark", "--method", help="The speculative method."),
    num_spec_tokens: int = typer.Option(7, "--num-spec-tokens", "-k", help="K."),
    thinking: str = typer.Option("on", "--thinking", help="Thinking mode, on or off."),
    category: str = typer.Option("coding", "--category", help="Workload category."),
) -> None:
    """Resolve a golden AL from the shipped registry and show the schedule it implies."""
    with reported():
        registry = Registry.load()
        res = resolve(
            model=model,
            method=method,
            num_spec_tokens=num_spec_tokens,
            registry=registry,
            workload=WorkloadAcceptance.model_validate(
                {"thinking": thinking, "category": category}
            ),
        )
    out_console.rule(
        f"speclens demo: {model} / {method} / K {num_spec_tokens} / thinking {thinking} / {category}"
    )
    out_console.print(
        f"The shipped registry holds {sum(len(s.profile_set.profiles) for s in registry)} profiles "
        f"in {len(registry)} sets; the resolver picked exactly one:\n"
    )
    print_resolution(res)
    cond = conditional_rates(res.per_position_rates)
    out_console.print(
        f"\nA forced-acceptance sampler walks the positions in order and accepts position i with "
        f"the conditional rate c_i = r_i / r_(i-1): {cond}.\n"
        f"Every step then accepts the counts above, so each target forward emits "
        f"{res.acceptance_length:g} tokens on average (its own plus {res.acceptance_length - 1:g} drafts)."
    )
