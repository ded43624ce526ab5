"""Writing a file so that a reader (or a crash) never sees half of it."""

from __future__ import annotations

import os


def atomic_write(path: str, write, binary: bool = False) -> None:
    """write(f) into a temporary file beside `path`, flush it to the disk, then rename it
    over `path` and flush the rename: after a crash, `path` is the old file or the new
    one, never a part of either."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
