"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from speclens.cli import app


@pytest.fixture
def run_cli():
    """Invoke ``speclens`` in-process; returns (exit code, stdout, stderr)."""
    runner = CliRunner()

    def run(*args: str | Path) -> tuple[int, str, str]:
        result = runner.invoke(app, [str(a) for a in args])
        return result.exit_code, result.stdout, result.stderr

    return run
