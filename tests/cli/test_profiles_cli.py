"""``speclens profiles ...`` and ``speclens demo`` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from speclens.acceptance import AcceptanceProfileSet, load

DONE = [
    "profiles", "resolve", "--model", "deepseek-v4.1-flash", "--method", "dspark",
    "--num-spec-tokens", "5", "--thinking", "on", "--category", "coding",
]  # fmt: skip

JSON_KEYS = {
    "acceptance_length",
    "per_position_rates",
    "layer",
    "profile_set",
    "source",
    "fallback_category",
    "measured_on",
    "rates_derived",
}


def test_resolve_json_meets_the_done_criterion(run_cli):
    code, out, _ = run_cli(*DONE, "--json")
    assert code == 0
    res = json.loads(out)
    assert set(res) >= JSON_KEYS
    assert res["acceptance_length"] == 3.51
    assert res["layer"] == "registry"
    assert res["per_position_rates"] == [1.0, 1.0, 0.51, 0.0, 0.0]
    assert res["rates_derived"] is True
    assert res["profile_set"] == "inferencex-golden-al"
    assert res["source"].endswith("dsv41flash_dspark.yaml")


def test_resolve_human_output_names_the_source(run_cli):
    code, out, _ = run_cli(*DONE, "--hardware", "h200")
    assert code == 0
    assert "3.51" in out and "registry" in out
    assert "measured on" in out and "b300" in out


def test_resolve_cli_value_wins_and_records_the_flag(run_cli):
    code, out, _ = run_cli(*DONE, "--acceptance-rate", "0.5", "--json")
    assert code == 0
    res = json.loads(out)
    assert res["layer"] == "cli"
    assert res["acceptance_length"] == 3.5
    assert res["per_position_rates"] == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert "--acceptance-rate" in res["source"]


def test_resolve_stated_rates_are_not_derived(run_cli):
    code, out, _ = run_cli(*DONE, "--per-position-rates", "0.9,0.5,0.2,0.1,0", "--json")
    assert code == 0
    res = json.loads(out)
    assert res["rates_derived"] is False
    assert abs(res["acceptance_length"] - 2.7) < 1e-9


def test_refusal_exits_1_with_one_line(run_cli):
    code, _out, err = run_cli(
        "profiles", "resolve", "--model", "deepseek-v4.1-flash", "--method", "dspark",
        "--num-spec-tokens", "7", "--thinking", "on", "--category", "coding",
    )  # fmt: skip
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("refused: no acceptance profile for deepseek-v4.1-flash/dspark/k7")


def test_invalid_cli_value_names_the_field(run_cli):
    code, _, err = run_cli(*DONE, "--acceptance-length", "9")
    assert code == 1
    assert "command line: acceptance_length: 9 lies outside [1, 6] (K = 5)" in err


def test_scenario_pin_with_fallback(run_cli, tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(
        "acceptance:\n  profiles: inferencex-golden-al\n  fallback_category: coding\n"
    )
    code, out, err = run_cli(
        "profiles", "resolve", "--model", "glm-5.3", "--method", "mtp", "--num-spec-tokens", "3",
        "--thinking", "on", "--category", "chat", "--scenario", scenario, "--json",
    )  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert res["layer"] == "scenario"
    assert res["acceptance_length"] == 2.99
    assert res["fallback_category"] == "chat"
    assert res["category"] == "coding"


def test_workload_file_supplies_terms_and_value(run_cli, tmp_path):
    workload = tmp_path / "workload.yaml"
    workload.write_text(
        'thinking: "on"\ncategory: coding\n'
        "acceptance: {num_spec_tokens: 5, acceptance_length: 2.0, source: a trace}\n"
    )
    code, out, err = run_cli(
        "profiles", "resolve", "--model", "deepseek-v4.1-flash", "--method", "dspark",
        "--num-spec-tokens", "5", "--workload", workload, "--json",
    )  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert (res["layer"], res["acceptance_length"], res["source"]) == ("workload", 2.0, "a trace")


def test_workload_file_contradicted_by_a_flag_is_a_usage_error(run_cli, tmp_path):
    workload = tmp_path / "workload.yaml"
    workload.write_text('thinking: "on"\ncategory: coding\n')
    code, _, err = run_cli(*DONE[:-4], "--thinking", "off", "--workload", workload)
    assert code == 2
    assert "contradicts" in err


def test_invalid_scenario_pin_is_reported_with_its_path(run_cli, tmp_path):
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(
        "acceptance:\n  profiles: x\n  value: {num_spec_tokens: 5, acceptance_length: 2}\n"
    )
    code, _, err = run_cli(*DONE, "--scenario", scenario)
    assert code == 1
    assert f"{scenario}: acceptance.profiles: is not allowed with value" in err


def test_validate_ok_and_every_problem(run_cli, tmp_path):
    code, out, _ = run_cli("profiles", "validate", Path("src/speclens/registry"))
    assert code == 0 and out.count(": ok (") == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: AcceptanceProfileSet\nname: bad\nprofiles:\n"
        "  - {model: m, speculative_method: s, num_spec_tokens: 2, thinking: 'on',"
        " category: coding, acceptance_length: 4, method: assumed, rationale: r}\n"
        "  - {model: m, speculative_method: s, num_spec_tokens: 0, thinking: 'on',"
        " category: Coding, acceptance_length: 1, method: measured}\n"
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [\n")
    code, _, err = run_cli("profiles", "validate", bad, broken)
    assert code == 1
    lines = err.strip().splitlines()
    assert f"{bad}: profiles[0].acceptance_length: 4 lies outside [1, 3] (K = 2)" in lines
    assert f"{bad}: profiles[1].num_spec_tokens: must be at least 1, got 0" in lines
    assert any(line.startswith(f"{bad}: profiles[1].category:") for line in lines)
    assert f"{bad}: profiles[1].provenance: is required with method measured" in lines
    assert any(line.startswith(f"{broken}: line ") for line in lines)


def test_list_shows_every_profile(run_cli, tmp_path):
    code, out, _ = run_cli("profiles", "list")
    assert code == 0
    assert out.count("kimi-k3-dspark-golden-al") == 8
    assert "deepseek-v4.1-flash" in out and "glm-5.3" in out


def test_list_with_a_user_registry(run_cli, tmp_path):
    (tmp_path / "acceptance").mkdir()
    (tmp_path / "acceptance" / "mine.yaml").write_text(
        "kind: AcceptanceProfileSet\nname: mine\nprofiles:\n"
        "  - {model: tiny, speculative_method: ngram, num_spec_tokens: 4, thinking: 'off',"
        " category: chat, acceptance_length: 1.9, method: assumed, rationale: a guess}\n"
    )
    code, out, _ = run_cli("profiles", "list", "--registry", tmp_path)
    assert code == 0
    assert "mine" in out and "tiny" in out and "1.9" in out


def test_resolve_prints_the_draft_coverage_a_profile_states(run_cli, tmp_path):
    """Human and --json output carry the coverage, and say whether it was stated."""
    (tmp_path / "acceptance").mkdir()
    (tmp_path / "acceptance" / "mine.yaml").write_text(
        "kind: AcceptanceProfileSet\nname: mine\nprofiles:\n"
        "  - {model: tiny, speculative_method: ngram, num_spec_tokens: 4, thinking: 'off',"
        " category: chat, acceptance_length: 1.46, draft_coverage: 0.386, method: assumed,"
        " rationale: a guess}\n"
        "  - {model: tiny, speculative_method: ngram, num_spec_tokens: 4, thinking: 'off',"
        " category: code, acceptance_length: 1.9, method: assumed, rationale: a guess}\n"
    )
    args = ["profiles", "resolve", "--model", "tiny", "--method", "ngram", "-k", "4",
            "--thinking", "off", "--registry", tmp_path]  # fmt: skip
    code, out, err = run_cli(*args, "--category", "chat", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert (res["draft_coverage"], res["draft_coverage_stated"]) == (0.386, True)
    code, out, err = run_cli(*args, "--category", "chat")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("draft coverage"))
    assert line.split(maxsplit=2)[2].rstrip() == "0.386 of decode steps draft  (stated)"
    code, out, err = run_cli(*args, "--category", "code", "--json")
    res = json.loads(out)
    assert (res["draft_coverage"], res["draft_coverage_stated"]) == (1.0, False)
    code, out, err = run_cli(*args, "--category", "code")
    line = next(x for x in out.splitlines() if x.startswith("draft coverage"))
    assert line.split(maxsplit=2)[2].rstrip() == (
        "1 of decode steps draft  (not stated: every step drafts)"
    )


def test_schema_shows_the_draft_coverage_field(run_cli):
    code, out, _ = run_cli("profiles", "schema")
    assert code == 0
    field = json.loads(out)["$defs"]["Profile"]["properties"]["draft_coverage"]
    assert {"type": "number", "exclusiveMinimum": 0, "maximum": 1}.items() <= field["anyOf"][
        0
    ].items()


def test_schema_is_json_schema_of_the_set(run_cli):
    code, out, _ = run_cli("profiles", "schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["title"] == "AcceptanceProfileSet"
    assert set(schema["required"]) == {"kind", "name", "profiles"}
    assert "Profile" in schema["$defs"]


INFERENCEX = """\
kimi-k3:
  thinking_on: {1: 1.84, 2: 2.45, 3: 2.87}
  thinking_off: {"2": 2.6}
"""


def test_import_inferencex_writes_a_valid_set(run_cli, tmp_path):
    src = tmp_path / "kimi_dspark.yaml"
    src.write_text(INFERENCEX)
    out_file = tmp_path / "kimi-curves.yaml"
    code, _, err = run_cli(
        "profiles", "import-inferencex", src, "--speculative-method", "dspark",
        "--hardware", "b300", "--engine-image", "img:1", "--temperature", "1.0",
        "--max-tokens", "4096", "--source", "https://example.org/kimi.yaml",
        "--setting", "rejection_sample_method=block", "--model-name", "kimi-k3=kimi-k3-fp8",
        "-o", out_file,
    )  # fmt: skip
    assert code == 0, err
    profile_set = load(AcceptanceProfileSet, out_file)
    assert profile_set.name == "kimi-curves"
    keys = {
        (p.model, p.thinking, p.num_spec_tokens): p.acceptance_length for p in profile_set.profiles
    }
    assert keys == {
        ("kimi-k3-fp8", "on", 1): 1.84,
        ("kimi-k3-fp8", "on", 2): 2.45,
        ("kimi-k3-fp8", "on", 3): 2.87,
        ("kimi-k3-fp8", "off", 2): 2.6,
    }
    first = profile_set.profiles[0]
    assert first.method == "measured"
    assert first.provenance is not None and first.provenance.hardware == "b300"
    assert first.provenance.settings == {"rejection_sample_method": "block"}
    code, out, _ = run_cli("profiles", "validate", out_file)
    assert code == 0 and "ok" in out


def test_import_inferencex_without_measured_facts_says_what_is_missing(run_cli, tmp_path):
    src = tmp_path / "curves.yaml"
    src.write_text(INFERENCEX)
    code, out, err = run_cli("profiles", "import-inferencex", src, "--speculative-method", "dspark")
    assert code == 1
    # each fact neither the header nor an option gives is named once, in one line
    assert f"{src}: hardware: the header states no hardware" in err
    assert "pass --hardware" in err and "pass --engine-image" in err and "pass --temperature" in err
    assert len(err.strip().splitlines()) == 3, err
    assert out == ""


def test_import_inferencex_as_assumed_to_stdout(run_cli, tmp_path):
    src = tmp_path / "curves.yaml"
    src.write_text(INFERENCEX)
    code, out, err = run_cli(
        "profiles", "import-inferencex", src, "--speculative-method", "dspark",
        "--method", "assumed", "--rationale", "quoted from a slide",
    )  # fmt: skip
    assert code == 0, err
    data = yaml.safe_load(out)
    assert data["name"] == "curves" and len(data["profiles"]) == 4


def test_import_inferencex_rejects_a_malformed_curve_file(run_cli, tmp_path):
    src = tmp_path / "curves.yaml"
    src.write_text("kimi-k3:\n  thinking_maybe: {1: 1.5}\n  thinking_on: {x: 1.5, 2: yes}\n")
    code, _, err = run_cli("profiles", "import-inferencex", src, "--speculative-method", "dspark")
    assert code == 1
    # a key that is not what it should be is located, never quoted
    assert f"{src}: kimi-k3: line 2, column 3: expected thinking_on or thinking_off" in err
    assert f"{src}: kimi-k3.thinking_on: line 3, column 17: expected K, a plain decimal" in err
    assert f"{src}: kimi-k3.thinking_on.2: AL True is not a finite number" in err


@pytest.mark.integration
def test_demo_replays_the_golden_al_end_to_end(run_cli, tmp_path):
    """Resolve 3.78, serve it forced, benchmark, verify, report, stop the server."""
    out = tmp_path / "demo"
    code, stdout, stderr = run_cli(
        "demo", "--num-requests", "16", "--max-tokens", "48", "--output-dir", out
    )
    assert code == 0, stdout + stderr
    assert "[1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]" in stdout
    assert "inferencex-golden-al-2026-08" in stdout
    assert "Forced speculative acceptance ON: mean acceptance length 3.7800" in stdout
    assert "verification PASS" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["verdict"]["passed"]
        and summary["figures"]["acceptance"]["requests_with_stats"] == 16
    )
    assert set(summary["figures"]["acceptance"]["histogram"]) <= {"2", "3"}
    assert (out / "records.jsonl").exists() and (out / "server.log").exists()


def test_console_script_runs():
    """The installed entry point, as a user would call it."""
    proc = subprocess.run(
        [sys.executable, "-m", "speclens", "--version"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("speclens ")
