"""The prompt-token bound (``limits.MAX_PROMPT_TOKENS``) holds where a run may keep every request
whole (the step-exact loop, or a run that writes records), and not on the fast path, which keeps
a prompt as its length: a million requests of 1,024 prompt tokens are refused there only by the
request-step budget."""

from __future__ import annotations

from pathlib import Path

from test_hostile_sim import _scenario, _sim

PROMPTS = (
    "workload.input_tokens: 1,000,000 requests (workload.requests) x up to 1,024 input tokens "
    "= 1,024,000,000 prompt tokens, over the limit of 200,000,000: lower workload.requests or "
    "workload.input_tokens"
)
STEPS = (
    "workload.requests: 1,000,000 requests x up to 32 output tokens (workload.output_tokens) = "
    "32,000,000 request-steps, over the budget of 1,000: lower workload.requests or "
    "workload.output_tokens, or raise --max-request-steps"
)


def test_a_million_long_prompts_are_refused_only_where_requests_are_kept(tmp_path: Path) -> None:
    path = _scenario(tmp_path, workload__requests=10**6, workload__input_tokens=1024,
                     deployment__pools__engine={"speculative": {"method": "dspark", "num_spec_tokens": 7},
                                    "max_model_len": 2048})  # fmt: skip
    code, err, _, _ = _sim(path, "--max-request-steps", 1000)
    assert (code, err) == (1, [f"{path}: {STEPS}"])
    code, err, _, _ = _sim(path, "--max-request-steps", 1000, "--exact")
    assert (code, err) == (1, [f"{path}: {STEPS}", f"{path}: {PROMPTS}"])
    out = tmp_path / "run"
    code, err, _, _ = _sim(path, "--max-request-steps", 1000, "--output-dir", out)
    assert (code, err) == (1, [f"{path}: {STEPS}", f"{path}: {PROMPTS}"])
    assert not out.exists()
