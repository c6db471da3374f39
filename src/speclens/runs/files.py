"""A run's output files, opened so that a link or a FIFO planted where one goes is refused.

The lowest of the run modules' writers: the reports (``report``, ``html``), the sweep and
``compare`` all open their files through ``open_new``."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


def open_new(path: Path, buffering: int = -1) -> BinaryIO:
    """``path`` created or truncated for writing, never through a symbolic link (``O_NOFOLLOW``)
    and only as a regular file: a link planted in the output directory must not send a run's
    files elsewhere, nor a FIFO hang it. Raises OSError naming the file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                exc.errno, "is a symbolic link (never written through)", str(path)
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb", buffering=buffering)
