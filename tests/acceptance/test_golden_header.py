"""The facts a golden file's header comments state (``acceptance.golden.read_header``), line by
line: which line wins where two name the method, the drafter, per-mode sampling and settings,
a malformed ``chat_template_kwargs`` named as a problem, and what the header is (the leading
comment block, bounded)."""

from __future__ import annotations

from speclens.acceptance.golden import (
    MAX_LINE,
    MAX_LINES,
    header_lines,
    method_from_name,
    read_header,
)

RUN = "https://github.com/SemiAnalysisAI/InferenceX/actions/runs/27317114007"


def _read(*lines: str) -> tuple:
    return read_header("".join(f"# {line}\n" for line in lines) + "m:\n  thinking_on: {}\n", "f")


def test_the_speculative_config_names_the_method_over_the_engine_words() -> None:
    header, problems = _read("speculative-config: method=EAGLE3 | draft_sample_method=greedy",
                             "Measured on m (B300, vLLM MTP, draft: org/drafter), per K")  # fmt: skip
    assert problems == []
    assert header.method == "eagle3"  # not the Measured-on line's "MTP"
    assert header.settings == {"draft_sample_method": "greedy"}
    assert (header.hardware, header.engine, header.drafter) == ("b300", "vllm", "org/drafter")


def test_a_measured_on_line_naming_two_methods_names_none() -> None:
    header, _ = _read("Measured on m (B300, vLLM MTP EAGLE3), per K")
    assert header.engine == "vllm" and header.method is None


def test_the_drafter_is_named_draft_or_drafter_and_never_empty() -> None:
    assert _read("Measured on m (B300, vLLM MTP, drafter: org/d)")[0].drafter == "org/d"
    assert _read("Measured on m (B300, vLLM MTP, draft: )")[0].drafter is None
    assert _read("Measured on m (B300, vLLM MTP, notes: x)")[0].drafter is None


def test_a_speculative_config_part_that_is_not_a_setting_is_skipped() -> None:
    header, _ = _read("speculative-config: see the run | method=dspark | seed=3")
    assert header.method == "dspark" and header.settings == {"seed": "3"}


def test_presence_penalty_is_a_setting_not_sampling() -> None:
    header, problems = _read(
        "dataset: Coding | top_p: 0.9 | presence_penalty: 0.5 | output_len: 2048",
        "thinking_off: temp 0.7 top_k 20 presence_penalty 1.5",
    )
    assert problems == []
    assert header.category == "coding"
    assert header.sampling == {"top_p": 0.9, "max_tokens": 2048}
    assert header.settings == {"presence_penalty": 0.5}
    assert header.mode_sampling == {"off": {"temperature": 0.7, "top_k": 20}}
    assert header.mode_settings == {"off": {"presence_penalty": 1.5}}


def test_sampling_is_not_read_inside_the_chat_template_kwargs() -> None:
    header, problems = _read(
        'thinking_on: temp 0.6 | chat_template_kwargs: {"note": "temp 0.9", "thinking": true}'
    )
    assert problems == []
    assert header.mode_sampling == {"on": {"temperature": 0.6}}
    assert header.mode_settings == {"on": {"chat_template_kwargs": {"note": "temp 0.9",
                                                                    "thinking": True}}}  # fmt: skip


def test_malformed_chat_template_kwargs_are_a_problem_naming_the_line() -> None:
    header, problems = _read(f"Source GitHub Actions run: {RUN}",
                             "thinking_on: temp 0.6 | chat_template_kwargs: {thinking: yes}")  # fmt: skip
    assert [(p.path, p.message) for p in problems] == [
        ("header line 2: thinking_on.chat_template_kwargs",
         "expected a JSON object, got '{thinking: yes}'"),
    ]  # fmt: skip
    assert header.run == RUN
    assert header.mode_sampling == {"on": {"temperature": 0.6}}
    assert "chat_template_kwargs" not in header.mode_settings["on"]


def test_the_header_is_the_leading_comment_block_bounded() -> None:
    longest = "#" + "x" * (MAX_LINE - 1)  # MAX_LINE characters: read
    text = f"#  a\n\n{longest}\n# b\nkey: 1\n# c\n"
    assert header_lines(text) == [(1, "a"), (3, longest[1:]), (4, "b")]
    overlong = "# a\n" + "#" + "x" * MAX_LINE + "\n# b\n"  # ends the header
    assert header_lines(overlong) == [(1, "a")]
    many = "".join(f"# {i}\n" for i in range(MAX_LINES + 5))
    lines = header_lines(many)
    assert len(lines) == MAX_LINES and lines[-1] == (MAX_LINES, str(MAX_LINES - 1))


def test_a_value_that_is_not_a_plain_number_is_not_read() -> None:
    header, problems = _read("dataset: coding | output_len: 4k | top_p: 0.95 | top_k: 2.0.1")
    assert problems == [] and header.sampling == {"top_p": 0.95}


def test_a_run_url_may_name_its_attempt() -> None:
    header, problems = _read(f"Source GitHub Actions run: {RUN}/attempts/2")
    assert problems == [] and header.run == f"{RUN}/attempts/2"


def test_a_method_in_a_file_name_is_a_whole_word() -> None:
    assert method_from_name("smtp_relay.yaml") is None
    assert method_from_name("qwen_mtp.yaml") == "mtp"
