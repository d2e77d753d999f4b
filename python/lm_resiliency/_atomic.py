"""Writing files so that readers see the old or the new content, never a torn one."""

from __future__ import annotations

import os
import tempfile
from typing import Union


def write_text_atomic(path: Union[str, os.PathLike], text: str) -> None:
    """Write `text` to a temporary file beside `path`, fsync it, rename it over `path`
    and fsync the directory."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
