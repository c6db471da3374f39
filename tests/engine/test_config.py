"""Engine configuration: every startup refusal of forced acceptance with its own message, the two
spellings resolving to one minimum-variance schedule, executor/method combinations, and the
startup log line (exact text, logged once, only when acceptance is forced)."""

from __future__ import annotations

import logging
import math

import pytest

from speclens.engine import ConfigError, Engine, EngineConfig, SpeculativeConfig

LOG_LINE = (
    "Forced speculative acceptance ON: mean acceptance length 3.7800 over 7 draft positions "
    "(per-position rates [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]). Throughput numbers from this "
    "run are synthetic; output text and accuracy are meaningless."
)
ENGINE_LOGGER = "speclens.engine.engine"

#: The golden AL column of the seed (Kimi-K3 DSpark, thinking on), K -> length.
GOLDEN = {1: 1.84, 2: 2.45, 3: 2.87, 4: 3.22, 5: 3.44, 6: 3.54, 7: 3.78, 8: 3.88}


def spec(**kwargs: object) -> SpeculativeConfig:
    kwargs.setdefault("method", "draft_model")
    kwargs.setdefault("num_speculative_tokens", 7)
    return SpeculativeConfig(**kwargs)  # type: ignore[arg-type]


def refusal(**kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        spec(**kwargs)
    return str(info.value)


# --------------------------------------------------------------------------- refusals


def test_both_spellings_refused() -> None:
    message = refusal(acceptance_length=3.78, acceptance_rate=2.78 / 7)
    assert "--spec-decode-acceptance-length" in message
    assert "--spec-decode-acceptance-rate" in message
    assert "only one" in message


@pytest.mark.parametrize("length", [0.5, 8.5, 0.0, -1.0, 100.0])
def test_length_outside_range_refused(length: float) -> None:
    message = refusal(acceptance_length=length)
    assert "[1, 8]" in message  # the range for K = 7, named in the message
    assert f"{length:g}" in message


def test_length_outside_range_names_range_for_k() -> None:
    # K + 1.5 for a few K: the range in the message follows K.
    for k in (1, 3, 7):
        message = refusal(num_speculative_tokens=k, acceptance_length=k + 1.5)
        assert f"[1, {k + 1}]" in message


@pytest.mark.parametrize("length", [math.nan, math.inf, -math.inf])
def test_length_not_finite_refused(length: float) -> None:
    refusal(acceptance_length=length)


@pytest.mark.parametrize("length", [1.0, 8.0])
def test_length_range_is_closed(length: float) -> None:
    config = spec(acceptance_length=length)
    assert config.forced
    assert config.per_position_rates == ([0.0] * 7 if length == 1.0 else [1.0] * 7)
    assert config.forced_acceptance_length == length


@pytest.mark.parametrize("rate", [-0.1, 1.1, 2.0, math.nan, math.inf])
def test_rate_outside_unit_interval_refused(rate: float) -> None:
    message = refusal(acceptance_rate=rate)
    assert "--spec-decode-acceptance-rate" in message
    assert "[0, 1]" in message


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_rate_range_is_closed(rate: float) -> None:
    config = spec(acceptance_rate=rate)
    assert config.per_position_rates == [rate] * 7


@pytest.mark.parametrize(
    "knob",
    [
        {"acceptance_length": 3.78},
        {"acceptance_rate": 0.4},
        {"acceptance_rates": [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]},
    ],
)
@pytest.mark.parametrize(
    "speculation",
    [
        {"method": None, "num_speculative_tokens": 0},
        {"method": None, "num_speculative_tokens": 7},
        {"method": "", "num_speculative_tokens": 7},
    ],
)
def test_forced_without_method_refused(knob: dict, speculation: dict) -> None:
    message = refusal(**speculation, **knob)
    assert "--method" in message
    assert "--num-speculative-tokens" in message
    assert "refused" in message


@pytest.mark.parametrize("method", ["draft_model", "dspark"])
def test_forced_with_zero_draft_positions_refused(method: str) -> None:
    message = refusal(method=method, num_speculative_tokens=0, acceptance_length=1.0)
    assert "num_speculative_tokens" in message


@pytest.mark.parametrize("k", [-1, 1.5, True, "7"])
def test_num_speculative_tokens_must_be_a_nonnegative_int(k: object) -> None:
    refusal(num_speculative_tokens=k)


@pytest.mark.parametrize(
    "knob",
    [
        {"acceptance_length": 3.78},
        {"acceptance_rate": 2.78 / 7},
        {"acceptance_rates": [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]},
    ],
)
def test_forced_with_confidence_schedule_refused(knob: dict) -> None:
    message = refusal(confidence_schedule=True, **knob)
    assert "confidence schedule" in message
    assert "ell_r" in message
    # At 3.78 over 7 positions the schedule is exact only while ell_r >= 3 (the seed's figure).
    assert "ell_r >= 3" in message
    assert "ell_r = 2" in message and "ell_r = 1" in message
    assert "refused" in message
    assert "drop confidence_schedule" in message


def test_confidence_schedule_alone_is_fine() -> None:
    config = spec(confidence_schedule=True)
    assert not config.forced
    assert config.per_position_rates is None
    assert config.log_line() is None


@pytest.mark.parametrize(
    ("rates", "what"),
    [
        ([0.5, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0], "rises at position 2"),
        ([1.0, 1.0, 0.78, 0.0, 0.0, 0.0], "expected K = 7"),
        ([1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0, 0.0], "expected K = 7"),
        ([1.2, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0], "outside [0, 1]"),
        ([1.0, 1.0, -0.1, -0.2, -0.3, -0.4, -0.5], "outside [0, 1]"),
        ([1.0, math.nan, 0.0, 0.0, 0.0, 0.0, 0.0], "finite"),
    ],
)
def test_explicit_rates_invalid_refused(rates: list[float], what: str) -> None:
    message = refusal(acceptance_rates=rates)
    assert "synthetic acceptance rates are invalid" in message
    assert what in message


def test_explicit_rates_disagreeing_with_length_refused() -> None:
    message = refusal(acceptance_rates=[1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0], acceptance_length=3.5)
    assert "3.78" in message and "3.5" in message
    # and with the rate spelling: 0.25 over 7 positions is length 2.75
    message = refusal(acceptance_rates=[1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0], acceptance_rate=0.25)
    assert "3.78" in message and "2.75" in message


def test_explicit_rates_agreeing_with_length_accepted() -> None:
    rates = [0.9, 0.8, 0.6, 0.3, 0.18, 0.0, 0.0]  # not minimum-variance, but sums to 2.78
    for extra in ({}, {"acceptance_length": 3.78}, {"acceptance_rate": 2.78 / 7}):
        config = spec(acceptance_rates=rates, **extra)
        assert config.per_position_rates == rates
        assert config.forced_acceptance_length == pytest.approx(3.78, abs=1e-12)


def test_each_refusal_has_its_own_message() -> None:
    messages = [
        refusal(acceptance_length=3.78, acceptance_rate=0.4),
        refusal(acceptance_length=8.5),
        refusal(acceptance_rate=1.5),
        refusal(method=None, num_speculative_tokens=0, acceptance_length=3.78),
        refusal(method="draft_model", num_speculative_tokens=0),
        refusal(confidence_schedule=True, acceptance_length=3.78),
        refusal(acceptance_rates=[0.5, 0.9, 0, 0, 0, 0, 0]),
        refusal(acceptance_rates=[1.0, 1.0, 0.78, 0, 0, 0, 0], acceptance_length=3.5),
    ]
    forced_dspark = spec(method="dspark", acceptance_length=3.78)
    with pytest.raises(ConfigError) as torch_dspark:
        EngineConfig(speculative=forced_dspark).validate()
    with pytest.raises(ConfigError) as sim_unforced:
        EngineConfig(executor="sim", speculative=spec()).validate()
    messages += [str(torch_dspark.value), str(sim_unforced.value)]
    assert all(messages)
    assert len(set(messages)) == len(messages)


# --------------------------------------------------------------------------- resolution


def test_minimum_variance_schedule_for_378_over_7() -> None:
    config = spec(acceptance_length=3.78)
    assert config.forced and config.enabled
    assert config.per_position_rates == [1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]
    assert config.forced_acceptance_length == 3.78


@pytest.mark.parametrize(("k", "length"), sorted(GOLDEN.items()))
def test_rate_spelling_resolves_to_the_same_rates(k: int, length: float) -> None:
    """length = 1 + K * rate: the rate form of each golden AL gives the same schedule."""
    rate = (length - 1.0) / k
    by_length = spec(num_speculative_tokens=k, acceptance_length=length)
    by_rate = spec(num_speculative_tokens=k, acceptance_rate=rate)
    assert by_rate.per_position_rates == by_length.per_position_rates
    assert by_rate.forced_acceptance_length == pytest.approx(length, abs=1e-12)
    assert by_rate.log_line() == by_length.log_line()
    rates = by_length.per_position_rates
    assert rates is not None and len(rates) == k
    assert math.fsum(rates) == pytest.approx(length - 1.0, abs=1e-12)
    # minimum variance: whole positions at 1, one fractional, zeros after
    whole = math.floor(length - 1.0 + 1e-12)
    assert rates[:whole] == [1.0] * whole
    assert all(r == 0.0 for r in rates[whole + 1 :])


def test_spellings_are_not_kept_downstream() -> None:
    # Everything downstream reads per_position_rates; forced is derived from it alone.
    config = spec(acceptance_rate=0.5)
    assert config.per_position_rates == [1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0]
    assert config.forced_acceptance_length == 4.5


# --------------------------------------------------------------------------- executors


def test_torch_executor_refuses_a_method_it_cannot_run() -> None:
    config = EngineConfig(speculative=spec(method="dspark", acceptance_length=3.78))
    with pytest.raises(ConfigError, match="dspark") as info:
        config.validate()
    assert "sim" in str(info.value)
    with pytest.raises(ConfigError, match="dspark"):
        Engine(config)
    # also without forced acceptance
    with pytest.raises(ConfigError, match="dspark"):
        EngineConfig(speculative=spec(method="dspark")).validate()


def test_sim_executor_accepts_dspark_when_forced() -> None:
    EngineConfig(
        executor="sim", speculative=spec(method="dspark", acceptance_length=3.78)
    ).validate()
    EngineConfig(executor="sim", speculative=spec(method="dspark", acceptance_rate=0.4)).validate()


@pytest.mark.parametrize("method", ["draft_model", "ngram", "dspark"])
def test_sim_executor_without_forced_acceptance_refused(method: str) -> None:
    config = EngineConfig(executor="sim", speculative=spec(method=method))
    with pytest.raises(ConfigError, match="acceptance must be forced"):
        config.validate()


def test_unknown_executor_refused() -> None:
    with pytest.raises(ConfigError, match="torch or sim"):
        EngineConfig(executor="tpu").validate()  # type: ignore[arg-type]


def test_kv_cache_must_hold_one_request() -> None:
    config = EngineConfig(max_model_len=128, kv_cache_tokens=128 + 7, speculative=spec())
    with pytest.raises(ConfigError, match="kv_cache_tokens"):
        config.validate()
    EngineConfig(max_model_len=128, kv_cache_tokens=128 + 7 + 1, speculative=spec()).validate()


# --------------------------------------------------------------------------- log line


def test_log_line_text_exact() -> None:
    assert spec(method="dspark", acceptance_length=3.78).log_line() == LOG_LINE
    assert spec(acceptance_rate=2.78 / 7).log_line() == LOG_LINE
    assert spec(acceptance_rates=[1.0, 1.0, 0.78, 0.0, 0.0, 0.0, 0.0]).log_line() == LOG_LINE
    assert spec().log_line() is None


def _forced_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "Forced speculative acceptance" in r.getMessage()
    ]


def test_engine_logs_forced_acceptance_once_at_startup(caplog: pytest.LogCaptureFixture) -> None:
    config = EngineConfig(
        kv_cache_tokens=4096,
        max_model_len=1024,
        speculative=spec(acceptance_length=3.78),
    )
    with caplog.at_level(logging.INFO, logger=ENGINE_LOGGER):
        engine = Engine(config)
        assert _forced_lines(caplog) == [LOG_LINE]
        record = next(r for r in caplog.records if r.getMessage() == LOG_LINE)
        assert record.levelno == logging.INFO
        assert record.name == ENGINE_LOGGER
        engine.generate(["hello", "world"])  # running does not log it again
    assert _forced_lines(caplog) == [LOG_LINE]


def test_sim_engine_logs_forced_acceptance(caplog: pytest.LogCaptureFixture) -> None:
    config = EngineConfig(
        executor="sim",
        kv_cache_tokens=4096,
        max_model_len=1024,
        speculative=spec(method="dspark", acceptance_length=3.78),
    )
    with caplog.at_level(logging.INFO, logger=ENGINE_LOGGER):
        Engine(config)
    assert _forced_lines(caplog) == [LOG_LINE]


@pytest.mark.parametrize("speculative", [SpeculativeConfig(), spec(), spec(method="ngram")])
def test_engine_does_not_log_when_not_forced(
    caplog: pytest.LogCaptureFixture, speculative: SpeculativeConfig
) -> None:
    config = EngineConfig(kv_cache_tokens=4096, max_model_len=1024, speculative=speculative)
    with caplog.at_level(logging.DEBUG):
        Engine(config).generate(["hello"])
    assert _forced_lines(caplog) == []
