"""Every engine test module runs torch single-threaded (see ``one_thread``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _engine_one_thread(one_thread: None) -> Iterator[None]:
    yield
