"""The live summary file (slurm_gpu.capture.livefile): who may read it, its in-place
rewrites and a reader that never takes a half-rewritten summary for a whole one."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from test_live_exporter import run_sampler

from slurm_gpu.capture import livefile
from slurm_gpu.capture.livefile import (
    LiveWriter,
    encode_live,
    live_intact,
    read_live,
    write_live,
)
from slurm_gpu.capture.spoolpaths import JobSpool
from slurm_gpu.errors import SpoolFormatError


def test_live_summary_is_the_writers_and_readable_by_the_group_given(tmp_path: Path) -> None:
    paths = JobSpool(str(tmp_path / "spool"), "42", "n1")
    write_live(paths, {"gpus": []}, None)
    st = os.stat(paths.live)
    assert stat.S_IMODE(st.st_mode) == 0o400 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(paths.live_job_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "spool-live").st_mode) == 0o711
    # Rewriting a read-only file works (rename, not open for writing).
    write_live(paths, {"gpus": [1]}, os.getegid())
    st = os.stat(paths.live)
    assert stat.S_IMODE(st.st_mode) == 0o440 and st.st_gid == os.getegid()
    assert stat.S_IMODE(os.stat(paths.live_job_dir).st_mode) == 0o750
    assert read_live(paths.live)["gpus"] == [1]


def test_the_sampler_rewrites_its_live_summary_in_place(tmp_path: Path) -> None:
    # Issue 29: a rename over the summary at every reading was most of the sampler's CPU at
    # the default cadence (ext4 allocates the new file's blocks at the rename).
    sampler = run_sampler(tmp_path, [50.0] * 3, 3)
    first = os.stat(sampler.paths.live)
    sampler.read_once()
    sampler.write_live()
    again = os.stat(sampler.paths.live)
    assert (again.st_ino, again.st_dev) == (first.st_ino, first.st_dev)
    assert stat.S_IMODE(again.st_mode) == stat.S_IMODE(first.st_mode)
    assert read_live(sampler.paths.live)["gpus"][0]["samples"] == 4


def test_rewrites_make_no_fsync_check_the_directories_once_and_survive_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = JobSpool(str(tmp_path / "spool"), "42", "n1")
    made: list[int | None] = []
    real_make = JobSpool.create_live_dir
    monkeypatch.setattr(
        JobSpool, "create_live_dir", lambda self, gid: made.append(gid) or real_make(self, gid)
    )
    syncs: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append(fd))
    writer = LiveWriter(paths, None)
    writer.write({"gpus": list(range(50))})
    for k in range(3):
        writer.write({"gpus": [k]})  # shorter: the padding, not a stale tail, follows it
    assert read_live(paths.live)["gpus"] == [2]
    assert made == [None] and syncs == []
    assert os.path.getsize(paths.live) == len(encode_live({"gpus": list(range(50))}))
    # Gone (the epilog removed it): made again, with its directories.
    paths.remove_live()
    writer.write({"gpus": [9]})
    assert read_live(paths.live)["gpus"] == [9] and made == [None, None]
    assert stat.S_IMODE(os.stat(paths.live_job_dir).st_mode) == 0o700
    writer.close()
    assert read_live(paths.live)["gpus"] == [9]


def test_a_half_rewritten_summary_is_never_taken_for_a_whole_one(tmp_path: Path) -> None:
    old = encode_live({"gpus": [{"utilization_pct": 47.0, "n": "x" * 30}]})
    new = encode_live({"gpus": [{"utilization_pct": 55.0, "n": "y" * 30}]})
    assert live_intact(old) and live_intact(new)
    assert live_intact(new + b"   ")
    # Every cut of a rewrite in progress: the new bytes up to it, the old ones after.
    for cut in range(1, len(new)):
        mixed = new[:cut] + old[cut:]
        if mixed not in (old, new):
            assert not live_intact(mixed), cut
    # A file caught mid-rewrite at every read: an error, not numbers from two summaries.
    path = tmp_path / "n1.json"
    cut = new.index(b"55.0") + 1
    path.write_bytes(new[:cut] + old[cut:])  # "57.0": a number neither summary holds
    with pytest.raises(SpoolFormatError, match="rewritten during each read"):
        read_live(str(path))
    # Written whole by a rename in an earlier release: no checksum, taken as it is.
    path.write_bytes(b'{"schema":"slurm-gpu/live","version":1,"gpus":[]}')
    assert read_live(str(path)) == {"schema": "slurm-gpu/live", "version": 1, "gpus": []}
    assert "crc" not in read_live(str(path))


def test_readers_racing_a_writer_see_whole_summaries_only(tmp_path: Path) -> None:
    paths = JobSpool(str(tmp_path / "spool"), "42", "n1")
    writer = LiveWriter(paths, None)
    writer.write({"k": 0, "pad": [0] * 1500, "end": 0})
    stop = threading.Event()

    def rewrite() -> None:
        k = 0
        while not stop.is_set():
            k += 1
            # Lengths vary, and the page boundary (4096 bytes) falls inside the summary.
            writer.write({"k": k, "pad": [k % 10] * (1200 + 700 * (k % 3)), "end": k})

    thread = threading.Thread(target=rewrite)
    thread.start()
    torn_retries = 0
    try:
        for _ in range(3000):
            try:
                body = read_live(paths.live)
            except SpoolFormatError:
                torn_retries += 1
                continue
            assert body["k"] == body["end"] and set(body["pad"]) <= {body["k"] % 10}
    finally:
        stop.set()
        thread.join()
    assert torn_retries < 3000


def test_summary_bytes_are_json_with_the_crc_last() -> None:
    data = encode_live({"gpus": [], "user": 'a"b,"crc":"00000000"}'})
    body = json.loads(data)
    assert list(body)[-1] == "crc" and body["user"] == 'a"b,"crc":"00000000"}'
    assert live_intact(data)
    with pytest.raises(ValueError, match="over"):
        encode_live({"gpus": ["x" * livefile.LIVE_MAX_BYTES]})
