"""Stack sampling on the node side: the burst schedule and budget, the sampler's hook, the
sealed record's new field (backward compatible), and who turns it on (the prolog)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_sampler import FakeClock, FakeHost, FakeSource, make_opts, stop_after

from slurm_gpu.capture import stackread
from slurm_gpu.capture.sampler import Sampler
from slurm_gpu.capture.spool import JobSpool, decode_record, encode_record, read_record
from slurm_gpu.capture.stackclass import Frame, load_table
from slurm_gpu.capture.stacksampler import StackOptions, StackSampler
from slurm_gpu.config import Settings, StacksSettings
from slurm_gpu.hooks.common import JobEnv
from slurm_gpu.hooks.prolog import sampler_command, stacks_wanted
from slurm_gpu.records import StackProcess, StackSummary

LOADER = Frame("/v/torch/utils/data/dataloader.py", "_MultiProcessingDataLoaderIter.__next__")
SAVE = Frame("/v/torch/serialization.py", "save")
MAIN = Frame("/home/a/train.py", "main")


class ScriptedStacks(StackSampler):
    """The real schedule, budget and counting; the job's processes and their stacks come
    from a script instead of a cgroup and py-spy."""

    def __init__(
        self, opts: StackOptions, stacks: list[list[Frame]], cpu_s: float, processes: int = 1
    ) -> None:
        super().__init__(opts, load_table(), lambda: "/cg", started_s=1000.0)
        self._procs = processes
        self._script = stacks
        self._cpu = cpu_s
        self.reads = 0
        self._with_ptrace = False  # whatever this machine's Yama says

    def _targets(self) -> tuple[str, list[stackread.JobProcess]]:
        return "/cg", [
            stackread.JobProcess(7 + i, 1, 1000, 1000, 1, True) for i in range(self._procs)
        ]

    def read_one(self, cgroup: str, p: stackread.JobProcess) -> stackread.DumpResult:
        frames = self._script[self.reads % len(self._script)]
        self.reads += 1
        return stackread.DumpResult(stackread.Stack(p.pid, tuple(frames), True), "", self._cpu)


def until(clock: FakeClock, end_s: float):  # type: ignore[no-untyped-def]
    """A wait() that advances the fake clock and asks to stop once it reaches ``end_s``."""

    def wait(timeout_s: float) -> bool:
        clock.now += timeout_s
        return clock.now >= end_s

    return wait


def test_bursts_follow_the_interval_and_the_record_carries_the_counts(tmp_path: Path) -> None:
    clock = FakeClock()
    opts = StackOptions(uid=1000, interval_s=60.0, first_burst_s=30.0, samples_per_burst=4)
    stacks = ScriptedStacks(opts, [[LOADER, MAIN], [LOADER, MAIN], [SAVE, MAIN], [MAIN]], 0.001)
    sampler = Sampler(
        make_opts(tmp_path), lambda: FakeSource(clock), FakeHost(clock), clock=clock, stacks=stacks
    )
    assert sampler.run(until(clock, 1300.0))  # 300 s of job
    record = read_record(JobSpool(str(tmp_path / "spool"), "42", "n1").record)
    st = record.stacks
    assert st is not None
    # Bursts at 30 s, then every 60 s: 30, 90, 150, 210, 270 -> 5 bursts of 4 samples.
    assert st.bursts == 5 and st.samples == 20
    got = dict(zip(st.classes, st.counts, strict=True))
    assert got["input_wait"] == 10 and got["checkpoint_io"] == 5 and got["other"] == 5
    assert st.deciding[st.classes.index("input_wait")] == ("dataloader.__next__",)
    assert st.processes == (StackProcess(7, 20, st.counts),)
    assert st.reader_cpu_s == pytest.approx(0.02)


def test_the_cpu_budget_pushes_the_next_burst_out(tmp_path: Path) -> None:
    clock = FakeClock()
    # 0.1 s of CPU per read, 4 reads per burst: 0.4 s, which at 1 % of a core is 40 s of
    # budget; with a 10 s interval the bursts come every ~40 s instead.
    opts = StackOptions(
        uid=1000, interval_s=10.0, first_burst_s=0.0, samples_per_burst=4, max_core_pct=1.0
    )
    stacks = ScriptedStacks(opts, [[MAIN]], 0.1)
    sampler = Sampler(
        make_opts(tmp_path), lambda: FakeSource(clock), FakeHost(clock), clock=clock, stacks=stacks
    )
    sampler.run(until(clock, 1400.0))
    st = stacks.summary()
    span = clock.now - 1000.0
    assert st.reader_cpu_s <= 0.01 * span + 0.4  # within 1 % of a core, one burst of slack
    assert st.bursts <= span / 40 + 1
    assert st.bursts >= 5


def test_a_stop_request_during_a_burst_ends_it_and_the_record_is_sealed(tmp_path: Path) -> None:
    clock = FakeClock()
    opts = StackOptions(uid=1000, first_burst_s=0.0, samples_per_burst=50)
    stacks = ScriptedStacks(opts, [[LOADER, MAIN]], 0.0)
    sampler = Sampler(
        make_opts(tmp_path), lambda: FakeSource(clock), FakeHost(clock), clock=clock, stacks=stacks
    )
    wait, waits = stop_after(clock, 3)  # the third wait (inside the first burst) says stop
    assert sampler.run(wait)
    assert len(waits) == 3 and stacks.reads == 3
    record = read_record(JobSpool(str(tmp_path / "spool"), "42", "n1").record)
    assert record.stacks is not None and record.stacks.samples == 3


def test_a_stop_request_is_answered_between_two_processes_of_one_round(tmp_path: Path) -> None:
    clock = FakeClock()
    opts = StackOptions(uid=1000, first_burst_s=0.0, samples_per_burst=5)
    stacks = ScriptedStacks(opts, [[MAIN]], 0.0, processes=8)
    sampler = Sampler(
        make_opts(tmp_path), lambda: FakeSource(clock), FakeHost(clock), clock=clock, stacks=stacks
    )
    wait, waits = stop_after(clock, 2)  # the second check (after two of 8 dumps) says stop
    assert sampler.run(wait)
    assert stacks.reads == 2 and waits == [0.0, 0.0]


SUMMARY = StackSummary(
    classes=("input_wait", "compute", "sleep_idle", "other"),
    counts=(41, 50, 9, 0),
    idle_counts=(30, 0, 9, 0),
    deciding=(("dataloader.__next__",), ("module._call_impl", "adam.step"), (), ()),
    interval_s=300.0,
    bursts=20,
    bursts_failed=1,
    first_s=1060.0,
    last_s=7000.0,
    processes=(StackProcess(11, 100, (41, 50, 9, 0)),),
    worker_samples=400,
    reader_cpu_s=0.5,
    notes=("left_job",),
)


def _record(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    sampler = Sampler(make_opts(tmp_path), lambda: FakeSource(clock), FakeHost(clock), clock=clock)
    wait, _ = stop_after(clock, 5)
    sampler.run(wait)
    return read_record(JobSpool(str(tmp_path / "spool"), "42", "n1").record)


def test_a_record_without_stacks_is_written_as_before(tmp_path: Path) -> None:
    record = _record(tmp_path)
    assert record.stacks is None
    data = encode_record(record)
    assert b'"stacks"' not in data  # an earlier collector reads it: no unknown field
    assert decode_record(data) == record


def test_a_record_with_stacks_round_trips_and_old_records_decode_unchanged(
    tmp_path: Path,
) -> None:
    record = dataclasses.replace(_record(tmp_path), stacks=SUMMARY)
    back = decode_record(encode_record(record))
    assert back.stacks == SUMMARY and back == record
    # A record sealed before the field existed: its JSON has no "stacks" key at all.
    body = json.loads(encode_record(record))
    del body["record"]["stacks"]
    assert decode_record(json.dumps(body).encode()).stacks is None


def env(partition: str, comment: str | None = None) -> JobEnv:
    return JobEnv("42", 1000, "alice", "0", None, 4, partition=partition, comment=comment)


def settings(**kw: object) -> Settings:
    return Settings(stacks=StacksSettings(**kw))  # type: ignore[arg-type]


def test_stack_sampling_is_off_by_default_and_on_per_partition_or_by_the_users_comment() -> None:
    assert not stacks_wanted(Settings(), env("gpu", "slurm-gpu:stacks"))
    assert stacks_wanted(settings(partitions=("gpu",)), env("gpu"))
    assert not stacks_wanted(settings(partitions=("gpu",)), env("a100"))
    assert stacks_wanted(settings(partitions=("*",)), env("a100"))
    opt_in = settings(user_opt_in_partitions=("gpu",))
    assert stacks_wanted(opt_in, env("gpu", "run 3 slurm-gpu:stacks"))
    assert not stacks_wanted(opt_in, env("gpu", "no thanks"))
    assert not stacks_wanted(opt_in, env("a100", "slurm-gpu:stacks"))  # not allowed there
    cmd = sampler_command(settings(partitions=("gpu",)), env("gpu"), ["GPU-a"], "n1")
    assert "--stacks" in cmd
    assert "--stacks" not in sampler_command(Settings(), env("gpu"), ["GPU-a"], "n1")


def test_the_comment_is_read_from_slurms_prolog_environment() -> None:
    e = JobEnv.from_environ({"SLURM_JOB_ID": "5", "SLURM_JOB_COMMENT": "slurm-gpu:stacks"})
    assert e.comment == "slurm-gpu:stacks"


def test_the_sampler_refuses_stacks_for_root_jobs_and_untrusted_tables(tmp_path: Path) -> None:
    from slurm_gpu.capture.hostsample import AutoHostSampler
    from slurm_gpu.hooks.sampler import open_stacks

    host = AutoHostSampler("42", 1000, cgroup_root=str(tmp_path), proc_root=str(tmp_path))
    assert open_stacks(Settings(), 0, host, 0.0) is None
    assert open_stacks(Settings(), None, host, 0.0) is None
    bad = tmp_path / "site.toml"
    bad.write_text("[[rule]]\nclass = 'nope'\nfile = 'x'\n")
    assert open_stacks(settings(classes_path=str(bad)), 1000, host, 0.0) is None
