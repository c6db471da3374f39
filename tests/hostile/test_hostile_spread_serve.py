"""``speclens serve --spec-decode-acceptance-spread FILE`` under bad input: quantiles that fall or
leave [1, K + 1], an implied mean beyond the tolerance of the forced AL, fewer than 20 requests,
another K, a file that cannot be read, no forced AL to spread, a profile beside it: each is
refused with exit 2 in one line naming the file and the field, and nothing is served (the
command never reaches ``run_server``, which binds the port). In process, through the command's
own checks: no server starts. A good file, and a profile's own spread, reach the engine's
configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.acceptance.spread import LEVEL_NAMES

QUANTILES = [1.6, 1.9, 2.2, 2.9, 3.8, 4.6, 5.4, 5.9, 6.8]  # K 7, implied mean 3.81
K5 = [1.5, 1.8, 2.0, 2.4, 2.9, 3.4, 3.9, 4.3, 5.0]
SIM = ["--executor", "sim", "--method", "dspark", "--num-speculative-tokens", "7"]
FORCED = [*SIM, "--spec-decode-acceptance-length", "3.8"]
FLAG = "--spec-decode-acceptance-spread"
LOG_LEVELS = ("DEBUG ", "INFO ", "WARNING ", "ERROR ", "CRITICAL ")


def body(quantiles: list[float] = QUANTILES, k: int = 7, **extra: Any) -> dict[str, Any]:
    return {
        "num_spec_tokens": k,
        "quantiles": dict(zip(LEVEL_NAMES, quantiles, strict=True)),
        "requests": 64,
        **extra,
    }


#: (id, the file's YAML document (None: no file at all), extra arguments, the field the one line
#: names after the file, a piece of what it says).
REFUSED: list[tuple[str, Any, list[str], str, str]] = [
    ("quantiles-fall", body([1.6, 1.9, 2.2, 2.9, 2.5, 4.6, 5.4, 5.9, 6.8]), FORCED, "quantiles",
     "fall from p25 2.9 to p50 2.5"),
    ("outside-range", body([1.6, 1.9, 2.2, 2.9, 3.8, 4.6, 5.4, 5.9, 8.5]), FORCED, "quantiles",
     "p100 8.5 outside [1, K + 1] = [1, 8]"),
    ("mean-beyond-tolerance", body(), [*SIM, "--spec-decode-acceptance-length", "3.0"],
     "quantiles", "imply a mean AL of 3.8100, 0.8100 from the stated acceptance_length 3"),
    ("mean-beyond-stated-tolerance", body(tolerance=0.005), FORCED, "quantiles",
     "beyond the tolerance 0.005"),
    ("too-few-requests", body(requests=19), FORCED, "requests", "must be at least 20, got 19"),
    ("other-k", body(K5, k=5), FORCED, "num_spec_tokens",
     "is 5, but --num-speculative-tokens is 7"),
    ("missing-file", None, FORCED, "(file)", "cannot be read"),
    ("not-a-mapping", [1, 2, 3], FORCED, "(document)", "expected a mapping"),
    ("no-forced-al", body(), SIM, "", "expected a forced acceptance length"),
]  # fmt: skip


@pytest.fixture
def refused_run(run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``serve`` with ``run_server`` replaced: returns (exit code, message lines, configs it was
    handed)."""
    from speclens.cli import serve

    handed: list[Any] = []
    monkeypatch.setattr(serve, "run_server", lambda config, *a, **k: handed.append((config, a)))

    def run(*args: str | Path) -> tuple[int, list[str], list[Any]]:
        code, _out, err = run_cli("serve", "--port", "0", *args)
        lines = [
            line for line in err.splitlines() if line.strip() and not line.startswith(LOG_LEVELS)
        ]
        return code, lines, handed

    return run


@pytest.mark.parametrize(
    ("name", "document", "args", "field", "message"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_a_bad_spread_is_refused_in_one_line_before_anything_is_served(
    refused_run: Any, tmp_path: Path, name: str, document: Any, args: list[str], field: str,
    message: str,
) -> None:  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    if document is not None:
        path.write_text(yaml.safe_dump(document))
    code, lines, handed = refused_run(*args, FLAG, path)
    assert code == 2, lines
    assert len(lines) == 1, lines
    where = f"{FLAG}: {path}: {field}: " if field else f"{FLAG} {path}: "
    assert lines[0].startswith(where), lines[0]
    assert message in lines[0], lines[0]
    assert "Traceback" not in lines[0]
    assert handed == []  # nothing bound, nothing served


def test_a_spread_beside_a_profile_is_refused(refused_run: Any, tmp_path: Path) -> None:
    path = tmp_path / "spread.yaml"
    path.write_text(yaml.safe_dump(body()))
    code, lines, handed = refused_run(*SIM, "--acceptance-profile", "registry", FLAG, path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"{FLAG} {path}: --acceptance-profile replays the profile's own")
    assert handed == []


@pytest.mark.parametrize(
    "forced",
    [["--spec-decode-acceptance-length", "3.8"], ["--spec-decode-acceptance-rate", "0.4"]],
    ids=["length", "rate"],
)
def test_a_good_spread_reaches_the_engine_configuration(
    refused_run: Any, tmp_path: Path, forced: list[str]
) -> None:
    path = tmp_path / "spread.yaml"
    path.write_text(yaml.safe_dump(body(source="a measured run")))
    code, lines, handed = refused_run(*SIM, *forced, FLAG, path)
    assert code == 0, lines
    ((config, _),) = handed
    spread = config.speculative.acceptance_spread
    assert spread.values == QUANTILES and spread.source == "a measured run"


def test_a_profile_s_own_spread_is_forced_without_the_flag(
    refused_run: Any, tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    profile = {
        "model": "dummy", "speculative_method": "dspark", "num_spec_tokens": 7,
        "thinking": "on", "category": "coding", "acceptance_length": 3.8, "method": "assumed",
        "rationale": "a test profile", "spread": body(),
    }  # fmt: skip
    document = {"kind": "AcceptanceProfileSet", "name": "spread-set", "profiles": [profile]}
    (registry / "spread-set.yaml").write_text(yaml.safe_dump(document))
    code, lines, handed = refused_run(
        *SIM, "--acceptance-profile", "spread-set", "--thinking", "on", "--category", "coding",
        "--registry", registry,
    )  # fmt: skip
    assert code == 0, lines
    ((config, args),) = handed
    assert config.speculative.acceptance_spread.values == QUANTILES
    assert config.speculative.forced_acceptance_length == pytest.approx(3.8)
    resolution = args[-1]
    assert resolution.spread.values == QUANTILES


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*FORCED, "--spec-decode-draft-coverage", "0"], "expected a number in (0, 1], got 0.0"),
        ([*FORCED, "--spec-decode-draft-coverage", "nan"], "expected a number in (0, 1], got nan"),
        ([*SIM, "--spec-decode-draft-coverage", "0.5"], "expected forced acceptance"),
    ],
)  # fmt: skip
def test_a_bad_draft_coverage_is_refused_in_one_line_before_anything_is_served(
    refused_run: Any, args: list[str], message: str
) -> None:
    code, lines, handed = refused_run(*args)
    assert code != 0 and handed == []
    assert len(lines) == 1 and "--spec-decode-draft-coverage" in lines[0], lines
    assert message in lines[0], lines[0]
