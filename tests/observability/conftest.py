"""The observability tier, run by ``make test-observability``: a real Prometheus (Debian's package,
installed by ``tests/observability/prometheus_env.py``) scraping a forced ``speclens serve``, and
the Grafana dashboard in ``deploy/grafana`` checked against it. A missing Prometheus fails the
tier; it never skips.

Fixtures:

- ``prometheus_bin`` (session): ``(prometheus, promtool)``, the executables on PATH.
"""

from __future__ import annotations

import pytest
from prometheus_env import INSTALL, binaries


@pytest.fixture(scope="session")
def prometheus_bin() -> tuple[str, str]:
    found = binaries()
    if found is None:
        pytest.fail(
            "prometheus and promtool are not on PATH: run `make test-observability` (it installs "
            f"them, as root) or `{' '.join(INSTALL)}`",
            pytrace=False,
        )
    return found
