"""conftest's end-of-session removal of the MPICH segments killed jobs leave in /dev/shm:
only this session's, only unmapped ones (others' jobs run alongside)."""

import mmap
import os
import time

from conftest import remove_session_shm


def segment(folder, name: str, mtime: float):
    path = folder / name
    path.write_bytes(b"\0" * 4096)
    os.utime(path, (mtime, mtime))
    return path


def test_only_this_sessions_unmapped_segments_are_removed(tmp_path):
    since = time.time() - 60
    before = segment(tmp_path, "mpich_shm_before_0", since - 10)   # an earlier session's: not ours to judge
    killed = segment(tmp_path, "mpich_shm_killed_0", since + 10)
    live = segment(tmp_path, "mpich_shm_live_0", since + 10)
    other = segment(tmp_path, "other_file", since + 10)
    with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096):   # a running job's: in use
        assert remove_session_shm(str(tmp_path), since, settle=1.0) == [str(killed)]
    assert not killed.exists() and before.exists() and live.exists() and other.exists()
    assert remove_session_shm(str(tmp_path), since, settle=1.0) == [str(live)]   # unmapped now


def test_a_segment_younger_than_settle_is_waited_for_then_removed(tmp_path):
    """A just-written segment may be one a starting job has not mapped yet: it is judged
    only once `settle` s old."""
    young = segment(tmp_path, "mpich_shm_young_0", time.time())
    start = time.monotonic()
    assert remove_session_shm(str(tmp_path), time.time() - 60, settle=0.5) == [str(young)]
    assert time.monotonic() - start >= 0.4 and not young.exists()
