"""``serve --dtype``: float32 unless asked, bfloat16 when asked, auto by the CPU's bf16 support,
and anything else refused before a model loads."""

from __future__ import annotations

from typing import Any

import pytest

from speclens.engine.model import native_bf16


@pytest.mark.parametrize(
    "flags, expected",
    [
        ((), "float32"),
        (("--dtype", "bfloat16"), "bfloat16"),
        (("--dtype", "float32"), "float32"),
        (("--dtype", "auto"), "bfloat16" if native_bf16() else "float32"),
    ],
)
def test_dtype_reaches_the_engine(
    run_cli: Any, monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], expected: str
) -> None:
    from speclens.cli import serve

    seen: list[Any] = []
    monkeypatch.setattr(serve, "run_server", lambda config, *a, **k: seen.append(config))
    code, _out, err = run_cli("serve", "--port", "0", *flags)
    assert code == 0, err
    assert [c.dtype for c in seen] == [expected]


def test_an_unknown_dtype_is_refused(run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from speclens.cli import serve

    monkeypatch.setattr(serve, "run_server", lambda *a, **k: pytest.fail("it started"))
    code, _out, err = run_cli("serve", "--port", "0", "--dtype", "int8")
    assert code == 2
    assert "--dtype" in err and "int8" in err
