"""Which GPUs belong to a job: Slurm's environment resolved to UUIDs.

Slurm hands the prolog and epilog ``SLURM_JOB_GPUS`` (global GPU indices: the ``N`` of the
gres.conf ``File=/dev/nvidiaN`` lines, i.e. the device minor number) and
``CUDA_VISIBLE_DEVICES``, which may hold indices, ``GPU-…`` UUIDs or ``MIG-…`` UUIDs (possibly
abbreviated to a unique prefix, as CUDA accepts). Ordinals are never trusted further than
this: everything after this module uses UUIDs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_gpu.records import GpuInfo
from slurm_gpu.telemetry.base import slurm_gpu_index

#: Values Slurm writes when a job has no GPU on this node.
_NO_GPU = {"", "nodevfiles", "none", "void", "n/a"}


@dataclass(frozen=True, slots=True)
class GpuResolution:
    """The job's GPUs on this node, and what could not be matched (for the log)."""

    uuids: tuple[str, ...]
    via: str
    """``SLURM_JOB_GPUS``, ``CUDA_VISIBLE_DEVICES`` or ``none``."""
    unresolved: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    """What the job holds, one key per device, for GPU ownership: the UUID of the GPU or of
    the MIG slice (a slice named ``MIG-GPU-<uuid>/<gi>/<ci>`` resolves to its own ``MIG-…``
    UUID; on a source that lists no slices, the GPU's UUID with ``/<gi>/<ci>``), so two
    slices of one GPU are two holdings. Empty: ``uuids``."""

    @property
    def owner_keys(self) -> tuple[str, ...]:
        """``keys``, or the UUIDs when no key was set."""
        return self.keys or self.uuids


def _tokens(value: str | None) -> list[str]:
    if value is None or value.strip().lower() in _NO_GPU:
        return []
    return [t.strip() for t in value.split(",") if t.strip()]


def _by_ordinal(token: str, gpus: Sequence[GpuInfo]) -> str | None:
    try:
        n = int(token)
    except ValueError:
        return None
    if n < 0:
        return None
    # The minor number, or the source's index where no minor number is known: the one rule
    # the sampler publishes as the GPU's number (the exporter's gpu_index label).
    for g in gpus:
        if slurm_gpu_index(g, gpus) == n:
            return g.uuid
    return None


def _slice_ids(rest: str) -> tuple[int, int] | None:
    """(gi, ci) of the ``<gi>/<ci>`` of a Slurm MIG name; ``None`` if not two numbers."""
    parts = rest.split("/")
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 4 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _by_slurm_mig_name(low: str, gpus: Sequence[GpuInfo]) -> tuple[str, str] | None:
    """(UUID to sample, ownership key) of Slurm's ``mig-gpu-<parent uuid>/<gi>/<ci>``
    (lower case).

    The slice, never its parent, whenever the source lists the parent's slices: the parent's
    memory, processes, power and energy are the sum of every tenant's. A name whose instance
    ids none of the listed slices carries (a slice destroyed since) is unresolved rather than
    widened to the GPU. Only a source that lists no slice of that GPU at all (virtual GPUs)
    samples the GPU, owned as ``<uuid>/<gi>/<ci>`` so that two slices are two holdings.
    """
    parent, _, rest = low[len("mig-") :].partition("/")
    ids = _slice_ids(rest)
    if ids is None:
        return None
    slices = [g for g in gpus if g.parent_uuid is not None and g.parent_uuid.lower() == parent]
    for g in slices:
        if (g.gpu_instance_id, g.compute_instance_id) == ids:
            return g.uuid, g.uuid
    if slices:
        return None
    whole = [g.uuid for g in gpus if g.uuid.lower() == parent]
    return (whole[0], f"{whole[0]}/{ids[0]}/{ids[1]}") if whole else None


def _by_uuid(token: str, gpus: Sequence[GpuInfo]) -> tuple[str, str] | None:
    """(UUID to sample, ownership key) of a UUID token; ``None`` if it matches no GPU."""
    low = token.lower()
    if low.startswith("mig-gpu-") and "/" in low:
        # MIG-GPU-<uuid>/<gi>/<ci>: Slurm's name of a slice (drivers before R470).
        return _by_slurm_mig_name(low, gpus)
    exact = [g.uuid for g in gpus if g.uuid.lower() == low]
    if exact:
        return exact[0], exact[0]
    if len(low) < len("GPU-") + 1:
        return None
    matches = [g.uuid for g in gpus if g.uuid.lower().startswith(low)]
    return (matches[0], matches[0]) if len(matches) == 1 else None


def resolve_job_gpus(
    slurm_job_gpus: str | None, cuda_visible_devices: str | None, gpus: Sequence[GpuInfo]
) -> GpuResolution:
    """Resolve the job's GPUs on this node to UUIDs, in order, without duplicates.

    UUIDs in ``CUDA_VISIBLE_DEVICES`` are the most specific (they name MIG slices) and win;
    otherwise ``SLURM_JOB_GPUS`` indices are matched to ``GpuInfo.minor_number`` (falling back
    to ``index`` when the source knows no minor numbers); otherwise integer
    ``CUDA_VISIBLE_DEVICES`` entries are matched the same way. Garbage is reported in
    ``unresolved``, never raised.
    """
    cvd = _tokens(cuda_visible_devices)
    uuid_tokens = [t for t in cvd if t.lower().startswith(("gpu-", "mig-"))]
    if uuid_tokens:
        by_uuid = [(t, _by_uuid(t, gpus)) for t in uuid_tokens]
        uuids = tuple(dict.fromkeys(u[0] for _t, u in by_uuid if u))
        if uuids:
            return GpuResolution(
                uuids,
                "CUDA_VISIBLE_DEVICES",
                tuple(t for t, u in by_uuid if u is None),
                tuple(dict.fromkeys(u[1] for _t, u in by_uuid if u)),
            )
    for via, tokens in (
        ("SLURM_JOB_GPUS", _tokens(slurm_job_gpus)),
        ("CUDA_VISIBLE_DEVICES", [t for t in cvd if t not in uuid_tokens]),
    ):
        if not tokens:
            continue
        found = [(t, _by_ordinal(t, gpus)) for t in tokens]
        uuids = tuple(dict.fromkeys(u for _t, u in found if u))
        unresolved = tuple(t for t, u in found if u is None)
        if uuids:
            return GpuResolution(uuids, via, unresolved)
    all_tokens = _tokens(slurm_job_gpus) + cvd
    return GpuResolution((), "none", tuple(dict.fromkeys(all_tokens)))


def job_has_gpu_env(slurm_job_gpus: str | None, cuda_visible_devices: str | None) -> bool:
    """Whether Slurm's environment names any GPU at all (cheap check before reading GPUs)."""
    return bool(_tokens(slurm_job_gpus) or _tokens(cuda_visible_devices))
