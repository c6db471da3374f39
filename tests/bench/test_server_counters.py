"""The client's scrape of vLLM's counters keeps to the model it loaded.

vLLM labels every speculative counter with ``model_name`` and ``engine``
(``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``): a server with two models, or two
engines of one model, exposes one sample per label set. The run's model is summed over its
engines; another model's traffic is not the run's.
"""

from __future__ import annotations

from speclens.bench.server import parse_metrics

TWO_MODELS = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="a"} 4
vllm:spec_decode_num_drafts_total{engine="1",model_name="a"} 1
vllm:spec_decode_num_drafts_total{engine="0",model_name="b"} 100
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="a"} 20
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="b"} 400
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="a"} 7
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="b"} 70
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a",position="0"} 5
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="a",position="0"} 1
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="a",position="1"} 1
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="b",position="0"} 50
"""


def test_the_loaded_model_is_summed_over_engines_and_other_models_left_out() -> None:
    counters = parse_metrics(TWO_MODELS, "a")
    assert counters == {
        "drafts": 5.0,
        "draft_tokens": 20.0,
        "accepted_tokens": 7.0,
        "accepted_per_position": {0: 6.0, 1: 1.0},
        "source": "metrics:vllm",
    }
    b = parse_metrics(TWO_MODELS, "b")
    assert b is not None and b["drafts"] == 100.0 and b["accepted_per_position"] == {0: 50.0}


def test_a_model_name_the_server_does_not_label_sums_everything() -> None:
    """A served name the labels do not carry (a proxy renaming it, or an exporter without the
    label) must not read as "no counters": everything is the run's."""
    for model in ("renamed", None):
        counters = parse_metrics(TWO_MODELS, model)
        assert counters is not None and counters["drafts"] == 105.0
        assert counters["accepted_tokens"] == 77.0
