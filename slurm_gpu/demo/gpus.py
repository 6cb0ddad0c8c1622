"""Which GPUs a job may drive: Slurm's global GPU indices, which are the devices' minor numbers."""

from __future__ import annotations

from collections.abc import Mapping

from slurm_gpu.errors import UsageError

#: Tried in order. SLURM_STEP_GPUS and SLURM_JOB_GPUS hold global indices (= the N of
#: /dev/nvidiaN in gres.conf); the step's come first because an ``srun --gres=gpu:1`` step
#: inherits the batch script's SLURM_JOB_GPUS (all the job's GPUs) but drives only its own.
#: CUDA_VISIBLE_DEVICES is a last resort because with device cgroups Slurm renumbers it from 0.
GPU_ENV_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")


def parse_index_list(text: str) -> list[int]:
    """Parse ``0,2`` or ``0-3,6`` into indices. Raises ``UsageError`` on anything else."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise UsageError(
                f"not a GPU index list: {text!r}",
                hint="expected global indices such as 0,1 (MIG or UUID lists are not supported)",
            ) from None
    return out


def job_gpu_minors(env: Mapping[str, str]) -> list[int]:
    """The minor numbers of the job's GPUs, from the first variable of ``GPU_ENV_VARS`` set."""
    for name in GPU_ENV_VARS:
        value = env.get(name, "").strip()
        if value and value not in ("NoDevFiles", "N/A"):
            return parse_index_list(value)
    raise UsageError(
        "this job has no GPUs (SLURM_JOB_GPUS is not set)",
        hint="submit with --gres=gpu:N, or pass --gpus 0,1 to run outside Slurm",
    )
