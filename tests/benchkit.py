"""``benchmarks/inferencex.py`` loaded as a module, for the tests that rerun part of it against
what the package ships (the chips' defaults, the accuracy table)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "inferencex.py"
DISAGG = SCRIPT.with_name("inferencex_disagg.py")


def inferencex_script(name: str = "inferencex_benchmark", script: Path = SCRIPT) -> ModuleType:
    """A fresh module of the script (its own name, so two test files never share state); its
    disaggregated section with ``script=DISAGG``."""
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
