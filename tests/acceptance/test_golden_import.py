"""``profiles import-inferencex`` on InferenceX's published golden AL files: the header comments
become provenance (run, benchmark, chip, engine, drafter, method, sampling per thinking mode), and
the nine files ship as the registry set ``inferencex-golden-al-2026-08``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from speclens.acceptance import AcceptanceProfileSet, Registry, WorkloadAcceptance, load, resolve
from speclens.acceptance.golden import method_from_name, read_header
from speclens.acceptance.registry import shipped_registry

#: InferenceX's golden curves, beside this checkout (shared/ sits next to the repository).
GOLDEN = Path(__file__).resolve().parents[3] / "shared" / "data" / "inferencex"
GOLDEN = GOLDEN / "golden_al_distribution"
needs_golden = pytest.mark.skipif(not GOLDEN.is_dir(), reason="the golden curves are not here")
UPSTREAM = "https://github.com/SemiAnalysisAI/InferenceX/blob/843c6254f/golden_al_distribution/"
SHIPPED = "inferencex-golden-al-2026-08"
#: The variants: the same model and drafter as another file, with other settings.
VARIANTS = {
    "kimik3_dspark_probabilistic_sample_method_block_rejection_sample_method.yaml": (
        "dspark-probabilistic-block"
    ),
    "minimaxm3_eagle3_gqa.yaml": "eagle3-gqa",
}
CAVEATS = [
    "Coding only. Every curve is SPEED-Bench coding; other categories have none.",
    "Measured on B300 with vLLM; the files do not state the engine release, which the run "
    "records. Reuse on another chip is recorded by the resolver.",
    "Two files are variants of another file's model and drafter: kimi-k3 with "
    "draft_sample_method probabilistic and rejection_sample_method block is method "
    "dspark-probabilistic-block, and minimax-m3 with the GQA EAGLE3 drafter is method eagle3-gqa.",
]

QWEN_HEADER = """\
# Source GitHub Actions run: https://github.com/SemiAnalysisAI/InferenceX/actions/runs/27317114007
# Acceptance Length (AL) reference values measured with SPEED-Bench.
# dataset: coding | output_len: 4096
# thinking_on : temp 0.6 top_p 0.95 top_k 20 presence_penalty 0.0 | chat_template_kwargs: {"enable_thinking": true}
# thinking_off: temp 0.7 top_p 0.8 top_k 20 presence_penalty 1.5 | chat_template_kwargs: {"enable_thinking": false}
# Measured on qwen3.5-397b-a17b-nvfp4 (B300, vLLM MTP), per num_speculative_tokens.
#
# key = num_speculative_tokens (MTP level); value = golden AL
qwen3.5-397b-a17b-nvfp4:
  thinking_on: {1: 1.93, 2: 2.73}
  thinking_off: {1: 1.92, 2: 2.70}
"""

KIMI_BLOCK_HEADER = """\
# Source GitHub Actions run: https://github.com/SemiAnalysisAI/InferenceX/actions/runs/30316471205
# Acceptance Length (AL) reference values measured with SPEED-Bench.
# dataset: coding | top_p: 0.95 | output_len: 4096
# thinking_on: temperature=1.0, chat_template_kwargs: {"thinking": true}
# speculative-config: draft_sample_method=probabilistic | rejection_sample_method=block
# Measured on kimi-k3 (B300, vLLM DSpark, draft: Inferact/Kimi-K3-DSpark), per num_speculative_tokens.
#
kimi-k3:
  thinking_on: {1: 1.85, 7: 3.84}
"""


def _import(run_cli, tmp_path: Path, *files: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    out = tmp_path / "set.yaml"
    code, _, err = run_cli("profiles", "import-inferencex", *files, *extra, "-o", out)
    assert code == 0, err
    load(AcceptanceProfileSet, out)  # validates
    data = yaml.safe_load(out.read_text())
    assert isinstance(data, dict)
    return data


def _by_mode(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["thinking"]: p for p in data["profiles"]}


# --------------------------------------------------------------------------- headers, inline
def test_per_mode_sampling_and_settings_come_from_the_header(run_cli, tmp_path: Path) -> None:
    """Qwen's header states temperature, top_p, top_k and presence_penalty per thinking mode."""
    src = tmp_path / "qwen3.5_mtp.yaml"
    src.write_text(QWEN_HEADER)
    modes = _by_mode(_import(run_cli, tmp_path, src))
    on, off = modes["on"], modes["off"]
    assert on["speculative_method"] == off["speculative_method"] == "mtp"
    assert on["category"] == "coding" and on["method"] == "measured"
    prov = on["provenance"]
    assert prov["run"] == "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/27317114007"
    assert prov["benchmark"] == "SPEED-Bench"
    assert prov["hardware"] == "b300"
    assert prov["engine_image"].startswith("vllm ")
    assert prov["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 4096}
    assert off["provenance"]["sampling"] == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "max_tokens": 4096,
    }
    assert prov["settings"] == {
        "chat_template_kwargs": {"enable_thinking": True},
        "presence_penalty": 0.0,
    }
    assert off["provenance"]["settings"]["presence_penalty"] == 1.5


def test_drafter_and_speculative_config_become_settings(run_cli, tmp_path: Path) -> None:
    src = tmp_path / "kimik3_dspark_probabilistic_block.yaml"
    src.write_text(KIMI_BLOCK_HEADER)
    profile = _by_mode(_import(run_cli, tmp_path, src))["on"]
    assert profile["speculative_method"] == "dspark"
    prov = profile["provenance"]
    assert prov["settings"] == {
        "drafter": "Inferact/Kimi-K3-DSpark",
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "block",
        "chat_template_kwargs": {"thinking": True},
    }
    assert prov["sampling"] == {"temperature": 1.0, "top_p": 0.95, "max_tokens": 4096}


def test_options_override_the_header(run_cli, tmp_path: Path) -> None:
    src = tmp_path / "kimik3_dspark.yaml"
    src.write_text(KIMI_BLOCK_HEADER)
    extra = (
        "--speculative-method", "dspark-block", "--hardware", "gb300", "--temperature", "0.5",
        "--run", "https://github.com/o/r/actions/runs/1", "--setting", "rejection_sample_method=x",
        "--source", "https://example.org/kimi.yaml",
    )  # fmt: skip
    profile = _by_mode(_import(run_cli, tmp_path, src, extra=extra))["on"]
    assert profile["speculative_method"] == "dspark-block"
    prov = profile["provenance"]
    assert prov["hardware"] == "gb300"
    assert prov["run"] == "https://github.com/o/r/actions/runs/1"
    assert prov["source"] == "https://example.org/kimi.yaml"
    assert prov["sampling"]["temperature"] == 0.5 and prov["sampling"]["top_p"] == 0.95
    assert prov["settings"]["rejection_sample_method"] == "x"


def test_a_method_only_the_file_name_states(run_cli, tmp_path: Path) -> None:
    src = tmp_path / "glm5.2_mtp.yaml"
    src.write_text(QWEN_HEADER.replace("vLLM MTP", "vLLM"))
    data = _import(run_cli, tmp_path, src)
    assert {p["speculative_method"] for p in data["profiles"]} == {"mtp"}


def test_a_method_neither_states_is_named_in_one_line(run_cli, tmp_path: Path) -> None:
    src = tmp_path / "qwen3.5.yaml"
    src.write_text(QWEN_HEADER.replace("vLLM MTP", "vLLM"))
    out = tmp_path / "set.yaml"
    code, stdout, err = run_cli("profiles", "import-inferencex", src, "-o", out)
    assert code == 1
    assert err.strip() == (
        f"{src}: speculative_method: neither the header nor the file name states it: "
        "pass --speculative-method"
    )
    assert not out.exists() and stdout == ""
    code, _, err = run_cli(
        "profiles", "import-inferencex", src, "--speculative-method", "mtp", "-o", out
    )
    assert code == 0, err


def test_a_per_file_method_names_one_of_the_files(run_cli, tmp_path: Path) -> None:
    src = tmp_path / "qwen3.5.yaml"
    src.write_text(QWEN_HEADER)
    code, _, err = run_cli(
        "profiles", "import-inferencex", src, "--speculative-method", "other.yaml=mtp"
    )
    assert code == 2
    assert "--speculative-method" in err and "other.yaml=mtp" in err


def test_method_from_name() -> None:
    assert method_from_name("kimik3_dspark.yaml") == "dspark"
    assert method_from_name("minimaxm3_eagle3_gqa.yaml") == "eagle3"
    assert method_from_name("dsv4-pro-0813-dspark.yaml") == "dspark"
    assert method_from_name("glm5.2_mtp.yaml") == "mtp"
    assert method_from_name("curves.yaml") is None
    assert method_from_name("mtp_or_eagle3.yaml") is None  # two: neither


def test_the_header_ends_at_the_body() -> None:
    text = "a:\n  thinking_on: {1: 1.5}\n# Measured on x (B300, vLLM MTP), per K\n"
    header, problems = read_header(text, "f.yaml")
    assert problems == [] and header.hardware is None and header.method is None


# --------------------------------------------------------------------------- the nine files
GOLDEN_FILES = sorted(p.name for p in GOLDEN.glob("*.yaml")) if GOLDEN.is_dir() else []


@needs_golden
def test_there_are_nine_golden_files() -> None:
    assert len(GOLDEN_FILES) == 9


@needs_golden
@pytest.mark.parametrize("name", GOLDEN_FILES)
def test_every_golden_file_imports_with_what_its_header_states(
    run_cli, tmp_path: Path, name: str
) -> None:
    src = GOLDEN / name
    text = src.read_text(encoding="utf-8")
    data = _import(run_cli, tmp_path, src)  # no option at all
    run = re.search(r"^# Source GitHub Actions run: (\S+)$", text, re.MULTILINE)
    assert run is not None
    method = re.search(r"\(B300, vLLM (\w+)", text)
    assert method is not None
    for profile in data["profiles"]:
        assert profile["method"] == "measured"
        assert profile["category"] == "coding"
        assert profile["speculative_method"] == method[1].lower()
        prov = profile["provenance"]
        assert prov["run"] == run[1]
        assert prov["hardware"] == "b300"
        assert prov["benchmark"] == "SPEED-Bench"
        assert prov["sampling"]["max_tokens"] == 4096
        temperature = prov["sampling"]["temperature"]
        mode = f"thinking_{profile['thinking']}"
        mode_line = re.search(rf"^# {mode}\s*:(.*)$", text, re.MULTILINE)
        stated = (
            re.search(r"temp(?:erature)?[=: ]\s*([0-9.]+)", mode_line[1]) if mode_line else None
        )
        if stated is None:  # the common line states it
            stated = re.search(r"\| temperature: ([0-9.]+)", text)
        assert stated is not None and temperature == float(stated[1]), (mode, temperature)
        top_p = re.search(rf"^# (?:{mode}.*)?.*top_p[: ]\s*([0-9.]+)", text, re.MULTILINE)
        if "top_p" in text:
            assert top_p is not None and "top_p" in prov["sampling"]
    curves = yaml.safe_load(text)
    assert len(data["profiles"]) == sum(len(c) for modes in curves.values() for c in modes.values())


@needs_golden
def test_the_shipped_set_is_what_the_importer_writes(run_cli, tmp_path: Path) -> None:
    """The committed set is regenerated from the nine files and compared byte for byte."""
    files = [GOLDEN / name for name in GOLDEN_FILES]
    extra: list[str] = ["--source-base", UPSTREAM, "--name", SHIPPED]
    for name, method in VARIANTS.items():
        extra += ["--speculative-method", f"{name}={method}"]
    for caveat in CAVEATS:
        extra += ["--caveat", caveat]
    out = tmp_path / f"{SHIPPED}.yaml"
    code, _, err = run_cli("profiles", "import-inferencex", *files, *extra, "-o", out)
    assert code == 0, err
    shipped = shipped_registry() / "acceptance" / f"{SHIPPED}.yaml"
    assert out.read_text(encoding="utf-8") == shipped.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- the shipped set
def test_the_shipped_set_carries_run_chip_and_sampling() -> None:
    registered = Registry.load().get(SHIPPED)
    assert registered is not None
    profiles = registered.profile_set.profiles
    assert len(profiles) == 112
    assert {p.model for p in profiles} == {
        "deepseek-v4-pro-0813",
        "deepseek-v4-pro",
        "glm-5.2-fp8",
        "kimi-k2.5-nvfp4",
        "kimi-k3",
        "minimax-m3",
        "qwen3.5-397b-a17b-nvfp4",
    }
    for p in profiles:
        assert p.method == "measured" and p.provenance is not None
        assert p.provenance.hardware == "b300"
        assert p.provenance.run and p.provenance.run.startswith(
            "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/"
        )
        assert p.provenance.source.startswith(UPSTREAM)
        assert p.provenance.sampling is not None and p.provenance.sampling.max_tokens == 4096
    kimi_on = [p for p in profiles if p.model == "kimi-k2.5-nvfp4"]
    temps = {p.thinking: p.provenance.sampling.temperature for p in kimi_on if p.provenance}  # type: ignore[union-attr]
    assert temps == {"on": 1.0, "off": 0.6}


@pytest.mark.parametrize(
    ("model", "method", "k", "thinking", "al"),
    [
        ("kimi-k3", "dspark", 7, "on", 3.78),
        ("kimi-k3", "dspark-probabilistic-block", 8, "on", 4.00),
        ("minimax-m3", "eagle3-gqa", 5, "off", 3.72),
        ("qwen3.5-397b-a17b-nvfp4", "mtp", 8, "off", 4.71),
        ("deepseek-v4-pro-0813", "dspark", 7, "on", 3.73),
    ],
)
def test_the_resolver_reads_one_al_a_k_from_the_set(
    model: str, method: str, k: int, thinking: str, al: float
) -> None:
    r = resolve(
        model=model,
        method=method,
        num_spec_tokens=k,
        registry=Registry.load(),
        workload=WorkloadAcceptance(thinking=thinking, category="coding"),  # type: ignore[arg-type]
        hardware="b300",
    )
    assert r.acceptance_length == al
    assert r.profile_set == SHIPPED and r.method == "measured"
    assert r.source is not None and r.source.startswith(UPSTREAM)


def test_a_k_sweep_resolves_every_k_from_the_set() -> None:
    registry = Registry.load()
    curve = [
        resolve(
            model="kimi-k3",
            method="dspark",
            num_spec_tokens=k,
            registry=registry,
            workload=WorkloadAcceptance(thinking="on", category="coding"),
        )
        for k in range(1, 9)
    ]
    assert [r.acceptance_length for r in curve] == [1.84, 2.45, 2.87, 3.22, 3.44, 3.54, 3.78, 3.88]
    assert {r.profile_set for r in curve} == {SHIPPED}
