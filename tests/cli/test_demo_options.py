"""``speclens demo -k`` is bounded like every other K option, before anything starts."""

from __future__ import annotations

import re
from typing import Any

import pytest


@pytest.mark.parametrize("k", ["0", "65", "1000000000"])
def test_demo_refuses_a_k_outside_the_bound_before_starting(run_cli: Any, k: str) -> None:
    code, _, err = run_cli("demo", "-k", k)
    assert code == 2
    assert "K is in [1, 64]" in re.sub(r"[│\s]+", " ", err)  # the usage box may wrap it
