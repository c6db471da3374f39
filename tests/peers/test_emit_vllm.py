"""``speclens profiles resolve --emit vllm`` read by vLLM 0.32.0's own code.

The emitted ``--speculative-config`` flag is parsed by vLLM's ``EngineArgs`` CLI parser
(``vllm/engine/arg_utils.py``, ``FlexibleArgumentParser``) and the dict it yields builds
``vllm/config/speculative.py``'s ``SpeculativeConfig``, whose validator checks the synthetic
rates (length K, each in [0, 1], non-increasing) and keeps them. The CPU build refuses to *run*
synthetic sampling, but the configuration object is the engine's check of what it would force.
Method ``ngram`` needs no target model config, so no model loads and no server starts: one
subprocess in the pinned vLLM environment reads every line.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from typing import Any

import vllm_env  # this directory is on sys.path (pytest's prepend import mode)

#: Runs inside the vLLM environment: a JSON list of command-line strings on stdin; for each, the
#: SpeculativeConfig's fields, or the refusal's first line.
READ_BACK = """
import json, shlex, sys
from vllm.config import SpeculativeConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

out = []
for line in json.load(sys.stdin):
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(shlex.split(line)))
    try:
        spec = SpeculativeConfig(**engine_args.speculative_config)
    except Exception as exc:
        out.append({"refused": str(exc).splitlines()[1] if "\\n" in str(exc) else str(exc)})
        continue
    out.append({
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "rejection_sample_method": spec.rejection_sample_method,
        "synthetic_acceptance_rates": spec.synthetic_acceptance_rates,
    })
print(json.dumps(out))
"""

BASE = ["profiles", "resolve", "--model", "smollm2-135m-instruct", "--method", "ngram",
        "-k", "4", "--thinking", "off", "--category", "coding"]  # fmt: skip
CASES: list[list[str]] = [
    [],  # the shipped registry's measured profile (derived schedule, stated coverage)
    ["--acceptance-length", "3.37"],  # an inline AL, minimum-variance schedule
    ["--per-position-rates", "0.9,0.6,0.35,0.1"],  # a stated schedule, kept as stated
]


def _emitted(run_cli: Any, extra: list[str]) -> tuple[str, dict[str, Any]]:
    code, line, err = run_cli(*BASE, *extra, "--emit", "vllm")
    assert code == 0, err
    code, resolution, err = run_cli(*BASE, *extra, "--json")
    assert code == 0, err
    return line.strip(), json.loads(resolution)


def _read_back(lines: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(vllm_env.python()), "-c", READ_BACK],
        input=json.dumps(lines), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_vllm_speculative_config_accepts_the_emitted_json(run_cli: Any) -> None:
    emitted = [_emitted(run_cli, extra) for extra in CASES]
    lines = [line for line, _ in emitted]
    # A control that vLLM must refuse, so an accepting read-back is not vacuous: the stated
    # schedule with a rise at position 3.
    flag, value = shlex.split(lines[2])
    spec = json.loads(value)
    spec["synthetic_acceptance_rates"][2] = 0.7
    control = f"{flag} {shlex.quote(json.dumps(spec))}"
    read = _read_back([*lines, control])
    assert len(read) == len(lines) + 1
    for (_, resolution), config in zip(emitted, read, strict=False):
        assert config == {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": resolution["per_position_rates"],
        }
    assert read[2]["synthetic_acceptance_rates"] == [0.9, 0.6, 0.35, 0.1]  # not re-derived
    assert "non-increasing" in read[-1]["refused"], read[-1]
