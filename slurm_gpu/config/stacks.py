"""Settings of stack sampling (``[stacks]``): the node side reads the job's Python stacks with
py-spy in short bursts; off unless a partition enables it (``docs/stacks.md``)."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu.config.fields import setting

#: What a user writes in ``--comment`` to ask for stack sampling where the site allows it.
OPT_IN_TOKEN = "slurm-gpu:stacks"


@dataclass(frozen=True)
class StacksSettings:
    """Opt-in stack sampling of the job's Python processes (units in names)."""

    partitions: tuple[str, ...] = setting(
        [],
        "Partitions whose jobs' Python stacks are sampled ('*': every partition); empty: none "
        "(off).",
    )
    user_opt_in_partitions: tuple[str, ...] = setting(
        [],
        "Partitions where a job is sampled when its user asks with --comment containing "
        "'slurm-gpu:stacks' ('*': every partition).",
    )
    py_spy_path: str = setting(
        "",
        "The py-spy executable (root's, not writable by others); empty: 'py-spy' beside the "
        "interpreter that runs the hooks.",
    )
    setpriv_path: str = setting(
        "/usr/bin/setpriv",
        "setpriv (util-linux): runs py-spy as the job's user with at most CAP_SYS_PTRACE.",
    )
    classes_path: str = setting(
        "",
        "The site's class table (TOML, root's), tried before the shipped one; empty: none.",
    )
    interval_s: float = setting(
        300.0, "Seconds between the starts of two bursts.", min=10, max=86400
    )
    first_burst_s: float = setting(
        60.0, "Seconds after the sampler starts before the first burst.", min=0, max=86400
    )
    samples_per_burst: int = setting(5, "Stack samples per process in one burst.", min=1, max=100)
    sample_spacing_s: float = setting(
        0.2, "Seconds between two samples of a burst.", min=0.01, max=10
    )
    max_core_pct: float = setting(
        1.0,
        "Most CPU the reader may use, percent of one core over the job (the next burst waits "
        "until its CPU time fits).",
        min=0.01,
        max=100,
    )
    max_processes: int = setting(
        16,
        "Most of the job's Python processes read per burst (lowest pids first).",
        min=1,
        max=256,
    )
    dump_timeout_s: float = setting(
        2.0, "Longest one py-spy dump may run before it is killed.", min=0.1, max=60
    )
    output_max_bytes: int = setting(
        1048576,
        "Most bytes of py-spy output read per dump (more: the dump is discarded).",
        min=4096,
    )
    memory_max_bytes: int = setting(536870912, "RLIMIT_AS of the reader, bytes.", min=16777216)
    ptrace_capability: str = setting(
        "auto",
        "Whether the reader gets CAP_SYS_PTRACE (and nothing else) on top of the job's uid: "
        "auto (only where Yama's ptrace_scope is 1 or more), always, never.",
        choices=("auto", "always", "never"),
    )
    charge_to_job: bool = setting(
        True,
        "Put the reader into the cgroup of the process it reads, so the job's limits and "
        "accounting carry its cost.",
    )
