"""Stack bursts for one job's sampler: when to read, whom, within what budget, and the class
counts that go into the sealed record (``NodeRecord.stacks``).

A burst reads each of the job's Python processes (``stackread``) ``samples_per_burst``
times, ``sample_spacing_s`` apart, classifies every main thread's stack (``stackclass``)
and adds it to the counts. Bursts start every ``interval_s``, but never sooner than the
reader's CPU time allows: after a burst that used ``c`` CPU seconds the next waits at least
``c / (max_core_pct / 100)`` seconds from its end, so over the job the reader stays within
``max_core_pct`` of one core. The sampler's stop signal ends a burst between two dumps, so
sealing waits for one dump at most (bounded by ``dump_timeout_s``).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from slurm_gpu.capture import stackread
from slurm_gpu.capture.stackclass import ClassTable, classify, role_of
from slurm_gpu.records import StackProcess, StackSummary
from slurm_gpu.textsafe import clean_user_text

log = logging.getLogger("slurm_gpu.sampler")

#: Most processes kept per node in ``StackSummary.processes``.
MAX_PROCESSES_KEPT = 16
#: Deciding frames kept per class in the record.
DECIDING_KEPT = 3
#: Distinct deciding frames counted per class (bounds memory whatever the job does).
DECIDING_TRACKED = 64


@dataclass(frozen=True, slots=True)
class StackOptions:
    """What the burst schedule and the reader need (from ``[stacks]``)."""

    uid: int
    interval_s: float = 300.0
    first_burst_s: float = 60.0
    samples_per_burst: int = 5
    sample_spacing_s: float = 0.2
    max_core_pct: float = 1.0
    max_processes: int = 16
    dump_timeout_s: float = 2.0
    output_max_bytes: int = 1 << 20
    memory_max_bytes: int = 512 << 20
    py_spy: str = ""
    setpriv: str = "/usr/bin/setpriv"
    ptrace_capability: str = "auto"
    """``auto``, ``always`` or ``never``."""
    charge_to_job: bool = True


class StackSampler:
    """One job's stack bursts and their counts."""

    def __init__(
        self,
        opts: StackOptions,
        table: ClassTable,
        cgroup_dir: Callable[[], str | None],
        *,
        started_s: float,
        proc_root: str = "/proc",
    ) -> None:
        self.opts = opts
        self.table = table
        self._cgroup_dir = cgroup_dir
        self._proc_root = proc_root
        self._next_s = started_s + opts.first_burst_s
        n = len(table.classes)
        self.counts = [0] * n
        self.idle_counts = [0] * n
        self._index = {c: i for i, c in enumerate(table.classes)}
        self._deciding: list[Counter[str]] = [Counter() for _ in range(n)]
        self._per_pid: dict[int, list[int]] = {}
        self.worker_samples = 0
        self.bursts = 0
        self.bursts_failed = 0
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.cpu_s = 0.0
        self.notes: set[str] = set()
        self._with_ptrace = self._ptrace_wanted()

    def _ptrace_wanted(self) -> bool | None:
        """Whether the reader gets CAP_SYS_PTRACE; ``None``: reading is impossible."""
        mode = self.opts.ptrace_capability
        scope = stackread.ptrace_scope()
        if scope >= 3:
            self.notes.add("ptrace_disabled")
            return None
        if mode == "always":
            return True
        if mode == "never":
            if scope >= 1:
                self.notes.add("ptrace_scope_needs_capability")
                return None
            return False
        return scope >= 1

    def due(self, now: float) -> bool:
        """Whether a burst should start now."""
        return now >= self._next_s and self._with_ptrace is not None and self.opts.uid != 0

    # ------------------------------------------------------------------ one burst

    def _targets(self) -> tuple[str, list[stackread.JobProcess]] | None:
        cgroup = self._cgroup_dir()
        if cgroup is None:
            self.notes.add("no_cgroup")
            return None
        procs = []
        for pid in stackread.list_job_pids(cgroup):
            p = stackread.job_process(pid, self._proc_root)
            # Never root's (slurmstepd shares the cgroup), never another user's.
            if p is not None and p.python and p.uid == self.opts.uid and p.uid != 0:
                procs.append(p)
            if len(procs) >= self.opts.max_processes:
                break
        return cgroup, procs

    def _still_the_jobs(self, cgroup: str, p: stackread.JobProcess) -> bool:
        """The pid read is still in the job's cgroup and still the same process."""
        again = stackread.job_process(p.pid, self._proc_root)
        return (
            again is not None
            and again.start == p.start
            and p.pid in stackread.list_job_pids(cgroup)
        )

    def read_one(self, cgroup: str, p: stackread.JobProcess) -> stackread.DumpResult:
        """Read one stack of ``p`` with the least privilege that works."""
        py_spy = self.opts.py_spy or stackread.default_reader_path()
        argv = stackread.reader_argv(
            py_spy,
            p,
            setpriv=self.opts.setpriv,
            with_ptrace=bool(self._with_ptrace),
            as_root=os.geteuid() == 0,
        )
        files = (
            stackread.cgroup_procs_files(p.pid, self._proc_root) if self.opts.charge_to_job else []
        )
        out, err, error, cpu = stackread.run_reader(
            argv,
            timeout_s=self.opts.dump_timeout_s,
            output_max_bytes=self.opts.output_max_bytes,
            preexec=stackread.child_setup(files, self.opts.memory_max_bytes),
        )
        if out is None:
            if error not in self.notes:  # once per kind: the reader's first line, cleaned
                line = err.decode("utf-8", "replace").strip().splitlines()[:1]
                log.info("stack read %s: %s", error, clean_user_text(line[0], 200) if line else "")
            return stackread.DumpResult(None, error or "failed", cpu)
        stack = stackread.parse_dump(out, p.pid)
        if stack is None:
            return stackread.DumpResult(None, "unparsable", cpu)
        if not self._still_the_jobs(cgroup, p):
            return stackread.DumpResult(None, "left_job", cpu)
        return stackread.DumpResult(stack, "", cpu)

    def burst(
        self,
        now: float,
        gpus_idle: bool | None,
        wait: Callable[[float], bool],
        clock: Callable[[], float],
    ) -> bool:
        """Run one burst; returns True when ``wait`` reported a stop request meanwhile."""
        self._next_s = now + self.opts.interval_s
        found = self._targets()
        if not found or not found[1]:
            self.bursts_failed += 1
            if found is not None:
                self.notes.add("no_python_process")
            return False
        cgroup, procs = found
        cpu = 0.0
        read = 0
        stopped = False
        for k in range(self.opts.samples_per_burst):
            if k and wait(self.opts.sample_spacing_s):
                stopped = True
                break
            stacks = {}
            for j, p in enumerate(procs):
                if j and wait(0.0):  # a stop request waits for one dump at most
                    stopped = True
                    break
                result = self.read_one(cgroup, p)
                cpu += result.cpu_s
                if result.stack is None:
                    self.notes.add(result.error)
                    continue
                stacks[p.pid] = (p, result.stack)
            read += len(stacks)
            self._count(stacks, gpus_idle)
            if stopped:
                break
        end = clock()
        self.cpu_s += cpu
        if read:
            self.bursts += 1
            self.first_s = now if self.first_s is None else self.first_s
            self.last_s = end
        else:
            self.bursts_failed += 1
        # The budget: this burst's CPU time spread at max_core_pct of one core.
        self._next_s = max(self._next_s, end + cpu / (self.opts.max_core_pct / 100.0))
        return stopped

    def _count(
        self,
        stacks: dict[int, tuple[stackread.JobProcess, stackread.Stack]],
        gpus_idle: bool | None,
    ) -> None:
        roles = {pid: role_of(st.frames, self.table) for pid, (_p, st) in stacks.items()}
        for pid, (p, st) in stacks.items():
            role = roles[pid]
            if role == "child" and roles.get(p.ppid) == "launcher":
                role = None  # a rank started by mp.spawn
            if role is not None:
                if role != "launcher":
                    self.worker_samples += 1
                continue
            verdict = classify(st.frames, st.active, self.table)
            i = self._index[verdict.cls]
            self.counts[i] += 1
            if gpus_idle:
                self.idle_counts[i] += 1
            if verdict.deciding:
                tracked = self._deciding[i]
                if verdict.deciding in tracked or len(tracked) < DECIDING_TRACKED:
                    tracked[verdict.deciding] += 1
            per = self._per_pid.get(pid)
            if per is None and len(self._per_pid) < MAX_PROCESSES_KEPT:
                per = self._per_pid[pid] = [0] * len(self.counts)
            if per is not None:
                per[i] += 1

    # ------------------------------------------------------------------ the record

    def summary(self) -> StackSummary:
        """The counts so far, as the sealed record keeps them."""
        return StackSummary(
            classes=self.table.classes,
            counts=tuple(self.counts),
            idle_counts=tuple(self.idle_counts),
            deciding=tuple(
                tuple(name for name, _n in c.most_common(DECIDING_KEPT)) for c in self._deciding
            ),
            interval_s=self.opts.interval_s,
            bursts=self.bursts,
            bursts_failed=self.bursts_failed,
            first_s=self.first_s,
            last_s=self.last_s,
            processes=tuple(
                StackProcess(pid, sum(c), tuple(c)) for pid, c in sorted(self._per_pid.items())
            ),
            worker_samples=self.worker_samples,
            reader_cpu_s=round(self.cpu_s, 6),
            notes=tuple(sorted(self.notes)),
        )
