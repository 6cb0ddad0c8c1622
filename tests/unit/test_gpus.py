"""Resolving Slurm's GPU environment to UUIDs (slurm_gpu.hooks.gpus)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu.hooks.gpus import job_has_gpu_env, resolve_job_gpus
from slurm_gpu.records import GpuInfo

# Minor numbers deliberately differ from the source's index, as on nodes where NVML orders
# GPUs by PCI bus and /dev/nvidiaN by driver probe order.
NODE = [
    GpuInfo(uuid="GPU-aaaa1111-0000-0000-0000-000000000000", index=0, minor_number=2),
    GpuInfo(uuid="GPU-bbbb2222-0000-0000-0000-000000000000", index=1, minor_number=0),
    GpuInfo(uuid="GPU-bbbb3333-0000-0000-0000-000000000000", index=2, minor_number=1),
    GpuInfo(uuid="GPU-dddd4444-0000-0000-0000-000000000000", index=3, minor_number=3),
]
A, B, C, D = (g.uuid for g in NODE)
MIG = [
    GpuInfo(uuid="GPU-eeee5555-0000-0000-0000-000000000000", index=0, minor_number=0),
    GpuInfo(
        uuid="MIG-11111111-2222-3333-4444-555555555555",
        parent_uuid="GPU-eeee5555-0000-0000-0000-000000000000",
        mig_profile="1g.10gb",
        gpu_instance_id=1,
        compute_instance_id=0,
    ),
    GpuInfo(
        uuid="MIG-66666666-2222-3333-4444-555555555555",
        parent_uuid="GPU-eeee5555-0000-0000-0000-000000000000",
        mig_profile="1g.10gb",
        gpu_instance_id=2,
        compute_instance_id=0,
    ),
]


def test_slurm_indices_match_minor_numbers_not_nvml_index() -> None:
    r = resolve_job_gpus("0,2", "0,2", NODE)
    assert r.uuids == (B, A)
    assert r.via == "SLURM_JOB_GPUS"
    assert r.unresolved == ()


def test_index_fallback_when_source_knows_no_minor_numbers() -> None:
    gpus = [GpuInfo(uuid=g.uuid, index=g.index) for g in NODE]
    assert resolve_job_gpus("1", None, gpus).uuids == (B,)


def test_full_uuids_in_cuda_visible_devices_win() -> None:
    r = resolve_job_gpus("0", f"{D},{C}", NODE)
    assert r.uuids == (D, C)
    assert r.via == "CUDA_VISIBLE_DEVICES"


def test_abbreviated_uuid_prefix_must_be_unique() -> None:
    assert resolve_job_gpus(None, "GPU-aaaa", NODE).uuids == (A,)
    # GPU-bbbb matches two GPUs: ambiguous, so not resolved; SLURM_JOB_GPUS is absent.
    r = resolve_job_gpus(None, "GPU-bbbb", NODE)
    assert r.uuids == ()
    assert r.unresolved == ("GPU-bbbb",)


def test_uuid_match_ignores_case() -> None:
    assert resolve_job_gpus(None, D.lower().replace("gpu-", "GPU-"), NODE).uuids == (D,)
    assert resolve_job_gpus(None, D.upper(), NODE).uuids == (D,)


def test_mig_uuids_name_the_slices() -> None:
    r = resolve_job_gpus("0", "MIG-66666666-2222-3333-4444-555555555555", MIG)
    assert r.uuids == ("MIG-66666666-2222-3333-4444-555555555555",)


def test_slurm_mig_name_resolves_to_the_slice_with_those_instance_ids() -> None:
    r = resolve_job_gpus(None, "MIG-GPU-eeee5555-0000-0000-0000-000000000000/2/0", MIG)
    assert r.uuids == ("MIG-66666666-2222-3333-4444-555555555555",)
    assert r.owner_keys == r.uuids


def test_slurm_mig_name_of_an_unknown_slice_is_not_widened_to_the_parent() -> None:
    r = resolve_job_gpus(None, "MIG-GPU-eeee5555-0000-0000-0000-000000000000/5/0", MIG)
    assert r.uuids == ()
    assert r.unresolved == ("MIG-GPU-eeee5555-0000-0000-0000-000000000000/5/0",)


def test_slurm_mig_name_on_a_source_without_slices_samples_the_gpu() -> None:
    # Virtual GPUs have no MIG slices: the GPU is all there is, owned per slice.
    r = resolve_job_gpus(None, "MIG-GPU-eeee5555-0000-0000-0000-000000000000/1/0", MIG[:1])
    assert r.uuids == ("GPU-eeee5555-0000-0000-0000-000000000000",)
    assert r.owner_keys == ("GPU-eeee5555-0000-0000-0000-000000000000/1/0",)


def test_indices_never_pick_a_mig_slice() -> None:
    assert resolve_job_gpus("0", None, MIG).uuids == ("GPU-eeee5555-0000-0000-0000-000000000000",)


@pytest.mark.parametrize("value", [None, "", "NoDevFiles", "nodevfiles", " ", ",,"])
def test_no_gpu(value: str | None) -> None:
    r = resolve_job_gpus(value, value, NODE)
    assert r.uuids == ()
    assert r.via == "none"
    assert not job_has_gpu_env(value, value)


@pytest.mark.parametrize("garbage", ["x", "-1", "1.5", "GPU-", "0x1", "99", "GPU-zzzz", "../0"])
def test_garbage_is_reported_not_raised(garbage: str) -> None:
    r = resolve_job_gpus(garbage, garbage, NODE)
    assert r.uuids == ()
    assert garbage in r.unresolved


def test_partly_garbage_keeps_the_good_ones() -> None:
    r = resolve_job_gpus("3,junk,1", None, NODE)
    assert r.uuids == (D, C)
    assert r.unresolved == ("junk",)


def test_duplicates_removed_in_order() -> None:
    assert resolve_job_gpus("1,1,0", None, NODE).uuids == (C, B)


def test_cuda_visible_devices_indices_used_when_slurm_job_gpus_missing() -> None:
    r = resolve_job_gpus(None, "3", NODE)
    assert r.uuids == (D,)
    assert r.via == "CUDA_VISIBLE_DEVICES"


def test_unknown_uuid_falls_back_to_slurm_indices() -> None:
    r = resolve_job_gpus("2", "GPU-ffff9999", NODE)
    assert r.uuids == (A,)


@given(st.text(max_size=40), st.text(max_size=40))
def test_never_raises_and_only_returns_node_uuids(job_gpus: str, cvd: str) -> None:
    r = resolve_job_gpus(job_gpus, cvd, NODE + MIG)
    assert set(r.uuids) <= {g.uuid for g in NODE + MIG}
    assert len(set(r.uuids)) == len(r.uuids)
