"""``--ray [ADDRESS]`` on ``sim`` and ``calibrate``: alone it starts a local Ray, with an address
it joins that cluster; a scenario after it stays the scenario; where Ray is not installed it says
how to install it, in one line, before any work. (The runs through a real Ray cluster are in
tests/sim/test_fanout_ray.py.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.cli import _fanout
from speclens.cli import sim as sim_cli
from speclens.sim import fanout

SMALL = {
    "model": "kimi-k3",
    "deployment": {"pools": [{"engine": {"speculative": {"method": "dspark", "num_spec_tokens": 3}}}]},
    "workload": {"category": "coding", "thinking": "on", "input_tokens": 16,
                 "output_tokens": 16, "concurrency": 2, "requests": 4},
}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["s.yaml", "--ray"], ["s.yaml", "--ray=local"]),
        (["s.yaml", "--ray", "--json"], ["s.yaml", "--ray=local", "--json"]),
        (["--ray", "s.yaml"], ["--ray=local", "s.yaml"]),
        (["s.yaml", "--ray", "10.0.0.5:6379"], ["s.yaml", "--ray=10.0.0.5:6379"]),
        (["s.yaml", "--ray", "ray://head:10001"], ["s.yaml", "--ray=ray://head:10001"]),
        (["s.yaml", "--ray", "auto", "--json"], ["s.yaml", "--ray=auto", "--json"]),
        (["s.yaml", "--ray=head:6379"], ["s.yaml", "--ray=head:6379"]),
        (["--", "--ray"], ["--", "--ray"]),
    ],
)
def test_the_word_after_ray_is_its_address_only_where_it_reads_as_one(
    args: list[str], expected: list[str]
) -> None:
    assert _fanout.optional_ray(args) == expected


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return path


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each fan-out's ``ray_address``; the points run in this process."""
    addresses: list[Any] = []

    def run(fn: Any, calls: Any, jobs: int, *, ray_address: Any = None, on_result: Any = None,
            in_flight: Any = None) -> list[Any]:  # fmt: skip
        addresses.append(ray_address)
        take = on_result or (lambda _i, r: r)
        return [take(i, fn(c)) for i, c in enumerate(calls)]

    monkeypatch.setattr(sim_cli, "fanout_run", run)
    return addresses


@pytest.mark.parametrize(
    ("flags", "address"),
    [
        (["--ray"], "local"),
        (["--ray", "--json"], "local"),
        (["--ray", "127.0.0.1:6379"], "127.0.0.1:6379"),
        ([], None),
    ],
)
def test_sim_ray_alone_starts_a_local_ray_and_ray_address_joins_it(
    run_cli, scenario: Path, seen: list[Any], flags: list[str], address: str | None
) -> None:
    code, out, err = run_cli("sim", scenario, "--sweep", "concurrency=1,2", *flags)
    assert code == 0, err
    assert seen == [address]
    assert "concurrency" in out


def test_ray_before_the_scenario_leaves_it_the_scenario(
    run_cli, scenario: Path, seen: list[Any]
) -> None:
    code, _, err = run_cli("sim", "--ray", scenario, "--sweep", "concurrency=1,2", "--json")
    assert code == 0, err
    assert seen == ["local"]


def test_without_ray_installed_ray_says_how_to_install_it(
    run_cli, scenario: Path, seen: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code, out, err = run_cli("sim", scenario, "--sweep", "concurrency=1,2", "--ray")
    assert code == 2
    assert err.strip().splitlines() == [
        "command line: --ray: Ray is not installed; install it with: pip install 'speclens[ray]'"
    ]
    assert out == "" and seen == []  # nothing simulated


@pytest.mark.parametrize("address", ["head:99999", "ray://", "http://head:6379"])
def test_an_address_that_is_not_one_is_refused(run_cli, scenario: Path, address: str) -> None:
    code, _, err = run_cli("sim", scenario, f"--ray={address}")
    assert code == 2
    assert f"command line: --ray: expected a Ray address (HOST:PORT, ray://HOST:PORT or auto), " \
           f"or none to start a local Ray, got {address!r}" in err  # fmt: skip


def test_ray_goes_with_a_scenario_not_a_replay(run_cli, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 8}\n')
    code, _, err = run_cli("sim", "--trace", trace, "--ray")
    assert code == 2
    assert "command line: --ray: goes with a scenario; a replay (--trace) is one run" in err


def test_calibrate_takes_ray_for_published_points_only(run_cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    code, _, err = run_cli("calibrate", run, "-o", tmp_path / "cost.yaml", "--ray")
    assert code == 2
    assert "command line: --jobs and --ray go with published points" in err


def test_a_ray_that_cannot_start_is_one_line_and_exit_1(
    run_cli, scenario: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoRay:
        exceptions = None

        @staticmethod
        def init(**_: Any) -> None:
            raise ConnectionError("Could not find any running Ray instance.\nmore")

    monkeypatch.setattr(fanout, "require_ray", lambda: NoRay)
    code, _, err = run_cli("sim", scenario, "--sweep", "concurrency=1,2", "--ray", "head:6379")
    assert code == 1
    assert err.strip().splitlines() == [
        "command line: --ray: cannot join the Ray cluster at head:6379: Could not find any "
        "running Ray instance."
    ]
