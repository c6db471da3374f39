"""A tier's system package, found on PATH, else installed with Debian's apt-get: chromium for the
browser tier, prometheus for the observability tier. A tier that cannot get its package fails
loudly (not root, no apt-get, the install failing); it is never skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


def install_command(package: str) -> list[str]:
    return ["apt-get", "install", "-y", "--no-install-recommends", package]


def ensure(
    tier: str, package: str, find: Callable[[], T | None], env: Mapping[str, str] | None = None
) -> T:
    """What ``find`` finds, after installing ``package`` where it finds nothing; SystemExit
    saying why not. ``env``: more of the install's environment."""
    found = find()
    if found:
        return found
    install = install_command(package)
    if shutil.which("apt-get") is None:
        raise SystemExit(f"{tier}: {package} is not installed and apt-get is not available")
    if os.geteuid() != 0:
        raise SystemExit(f"{tier}: {package} is not installed; run as root: {' '.join(install)}")
    full = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", **(env or {})}
    if subprocess.run(install, env=full, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=full, check=False)
        if subprocess.run(install, env=full, check=False).returncode != 0:
            raise SystemExit(f"{tier}: {' '.join(install)} failed")
    found = find()
    if not found:
        raise SystemExit(f"{tier}: {package} installed but not found on PATH")
    return found
