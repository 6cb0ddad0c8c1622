"""Accounting against the sealed node records: the same owner, the same nodes.

A sealed record is written by root on the node that ran the job, with the uid Slurm gave the
prolog (``SLURM_JOB_UID``) and the node's Slurm name. Accounting comes from slurmdbd. When the
two disagree about whose job it is or where it ran, one of them is wrong (a forged accounting
record, a record in the wrong job's directory), and storing the job would show one user's
telemetry under another user's name: the collector quarantines the job's records instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_gpu.records import JobRecord, NodeRecord


def short_host(host: str) -> str:
    """A host name without its domain (Slurm node names are usually short already)."""
    return host.split(".", 1)[0]


def is_earlier_run(job: JobRecord, node: NodeRecord) -> bool:
    """Whether ``node`` is the record of an earlier run of a requeued job on a node that the
    run accounting describes did not use: it ended before that run started."""
    hosts = {short_host(h) for h in job.nodelist}
    return (
        short_host(node.hostname) not in hosts
        and job.start_s is not None
        and node.ended_s < job.start_s
    )


def disagreement(job: JobRecord, nodes: Sequence[NodeRecord]) -> str | None:
    """Why ``nodes`` cannot be records of the job that accounting describes as ``job``, or
    ``None`` when they agree.

    Every record's uid, where the record has one (a record recovered without a checkpoint
    has none), must be accounting's uid; every record's host must be in accounting's node
    list (short names).
    """
    hosts = {short_host(h) for h in job.nodelist}
    for node in nodes:
        if node.uid is not None and node.uid != job.uid:
            return (
                f"the record of {node.hostname} was sealed for uid {node.uid}, but accounting "
                f"says job {job.job_id} belongs to uid {job.uid} ({job.user})"
            )
        if short_host(node.hostname) not in hosts:
            listed = ",".join(sorted(hosts)[:8]) or "no node"
            return (
                f"the record comes from {node.hostname}, which is not in accounting's node "
                f"list of job {job.job_id} ({listed})"
            )
    return None
