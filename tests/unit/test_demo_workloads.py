"""The demo workloads produce the intended GPU behaviour when read through VirtualGpuSource."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_gpu.demo.gpus import job_gpu_minors, parse_index_list
from slurm_gpu.demo.patterns import PATTERNS, DemoParams, OutOfMemory, run_pattern
from slurm_gpu.errors import UsageError
from slurm_gpu.records import GpuSample
from slurm_gpu.telemetry.virtual import VirtualGpuSource
from slurm_gpu.telemetry.virtual_device import VirtualGpuDevice, create_gpus


class SamplingClock:
    """A fake clock for both the workload and the source; every ``interval_s`` of fake time it
    reads all GPUs, as the sampler would."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.t = 2_000_000.0
        self.interval_s = interval_s
        self.next_read = self.t + interval_s
        self.on_read: Callable[[], None] = lambda: None

    def __call__(self) -> float:
        return self.t

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        if self.t >= self.next_read:
            self.next_read += self.interval_s
            self.on_read()


def run_and_sample(
    tmp_path: Path, pattern: str, n_gpus: int, **params: object
) -> tuple[list[list[GpuSample]], list[VirtualGpuDevice]]:
    clock = SamplingClock()
    create_gpus(tmp_path, n_gpus, clock=clock)
    source = VirtualGpuSource(tmp_path, clock=clock)
    uuids = [g.uuid for g in source.list_gpus()]
    readings: list[list[GpuSample]] = []
    clock.on_read = lambda: readings.append(list(source.sample(uuids)))
    source.sample(uuids)
    devices = [VirtualGpuDevice.open(tmp_path, m, clock=clock) for m in range(n_gpus)]
    run_pattern(pattern, devices, DemoParams(seed=7, **params), clock)  # type: ignore[arg-type]
    return readings, devices


def util(readings: list[list[GpuSample]], gpu: int) -> list[float]:
    return [r[gpu].utilization_pct or 0.0 for r in readings]


def mem_frac(readings: list[list[GpuSample]], gpu: int) -> list[float]:
    return [(r[gpu].memory_used_bytes or 0) / (r[gpu].memory_total_bytes or 1) for r in readings]


def test_healthy_is_busy_on_every_gpu(tmp_path: Path) -> None:
    readings, _ = run_and_sample(tmp_path, "healthy", 2, duration_s=20)
    assert len(readings) == 20
    for gpu in (0, 1):
        assert 90 <= statistics.mean(util(readings, gpu)) <= 98
        assert min(mem_frac(readings, gpu)) >= 0.7
        assert all(r[gpu].processes for r in readings)
        assert statistics.mean(r[gpu].sm_active_pct or 0 for r in readings[1:]) > 60


def test_idle_gpu_second_gpu_never_gets_a_process(tmp_path: Path) -> None:
    readings, _ = run_and_sample(tmp_path, "idle-gpu", 2, duration_s=10)
    assert statistics.mean(util(readings, 0)) > 85
    assert max(util(readings, 1)) == 0.0
    assert all(r[1].processes == () for r in readings)
    assert all(r[1].memory_used_bytes == 0 for r in readings)


def test_small_batch_steady_low_duty_little_memory(tmp_path: Path) -> None:
    readings, _ = run_and_sample(tmp_path, "small-batch", 1, duration_s=20)
    assert 20 <= statistics.mean(util(readings, 0)) <= 30
    assert max(mem_frac(readings, 0)) <= 0.15


def test_near_oom_holds_97_to_99_percent(tmp_path: Path) -> None:
    readings, _ = run_and_sample(tmp_path, "near-oom", 1, duration_s=10)
    fracs = mem_frac(readings, 0)
    assert min(fracs) >= 0.97 and max(fracs) <= 0.99


def test_near_oom_can_fail_like_cuda_oom(tmp_path: Path) -> None:
    with pytest.raises(OutOfMemory, match="CUDA out of memory"):
        run_and_sample(tmp_path, "near-oom", 1, duration_s=2, fail_oom=True)


def test_imbalance_others_wait_with_nvlink_traffic(tmp_path: Path) -> None:
    readings, _ = run_and_sample(tmp_path, "imbalance", 3, duration_s=10)
    assert statistics.mean(util(readings, 0)) > 85
    for gpu in (1, 2):
        assert statistics.mean(util(readings, gpu)) < 30
        moved = (readings[-1][gpu].nvlink_tx_bytes or 0) - (readings[0][gpu].nvlink_tx_bytes or 0)
        assert moved > 10e9


def test_idle_tail_goes_idle_but_keeps_the_gpu(tmp_path: Path) -> None:
    readings, _ = run_and_sample(tmp_path, "idle-tail", 1, duration_s=20, active_frac=0.5)
    u = util(readings, 0)
    assert statistics.mean(u[:9]) > 85
    assert max(u[11:-1]) == 0.0
    assert all(r[0].processes for r in readings[:-1])


@pytest.mark.parametrize("level", [0.1, 0.5, 0.8])
def test_util_flag_sets_the_duty_cycle(tmp_path: Path, level: float) -> None:
    readings, _ = run_and_sample(tmp_path, "healthy", 1, duration_s=20, util=level, noise=0.0)
    assert statistics.mean(util(readings, 0)) == pytest.approx(level * 100, abs=0.5)


def test_processes_are_released_at_the_end(tmp_path: Path) -> None:
    _, devices = run_and_sample(tmp_path, "healthy", 1, duration_s=2)
    (reading,) = VirtualGpuSource(tmp_path).sample([devices[0].uuid])
    assert reading.processes == () and reading.memory_used_bytes == 0


def test_dataloader_burns_cpu_in_workers_while_the_gpu_mostly_waits(tmp_path: Path) -> None:
    # Real CPU work needs the real clock; the duty cycle is read over the whole run.
    create_gpus(tmp_path, 1)
    source = VirtualGpuSource(tmp_path)
    uuid = source.list_gpus()[0].uuid
    source.sample([uuid])
    before = os.times()
    run_pattern(
        "dataloader",
        [VirtualGpuDevice.open(tmp_path, 0)],
        DemoParams(duration_s=2.0, workers=1, batch_cpu_s=0.2, gpu_burst_s=0.02, tick_s=0.1),
    )
    after = os.times()
    (reading,) = source.sample([uuid])
    children_cpu = (after.children_user + after.children_system) - (
        before.children_user + before.children_system
    )
    assert children_cpu > 0.5  # the workers did real CPU work
    assert reading.utilization_pct is not None and 0 < reading.utilization_pct < 40


def test_unknown_pattern_and_too_few_gpus(tmp_path: Path) -> None:
    create_gpus(tmp_path, 1)
    dev = VirtualGpuDevice.open(tmp_path, 0)
    with pytest.raises(UsageError, match="unknown demo pattern"):
        run_pattern("nope", [dev], DemoParams())
    with pytest.raises(UsageError, match="at least 2 GPUs"):
        run_pattern("imbalance", [dev], DemoParams())


def test_every_pattern_has_an_sbatch_script() -> None:
    share = Path(__file__).resolve().parents[2] / "share" / "demo"
    assert sorted(p.stem for p in share.glob("*.sbatch")) == sorted(PATTERNS)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_JOB_GPUS": "0,2"}, [0, 2]),
        ({"SLURM_JOB_GPUS": "1-3", "CUDA_VISIBLE_DEVICES": "0,1,2"}, [1, 2, 3]),
        ({"SLURM_STEP_GPUS": "3"}, [3]),
        # An srun step inherits the batch script's SLURM_JOB_GPUS; it drives only its own.
        ({"SLURM_JOB_GPUS": "0,1", "SLURM_STEP_GPUS": "1"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "0"}, [0]),
    ],
)
def test_job_gpus_from_slurm_environment(env: dict[str, str], expected: list[int]) -> None:
    assert job_gpu_minors(env) == expected


def test_job_without_gpus_and_bad_lists_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        job_gpu_minors({})
    with pytest.raises(UsageError):
        parse_index_list("GPU-1234")


def _idle_runs(values: list[float]) -> list[int]:
    """Lengths of the runs of zero readings between the first and last busy reading."""
    busy = [k for k, v in enumerate(values) if v > 5]
    runs, run = [], 0
    for v in values[busy[0] : busy[-1] + 1]:
        if v > 5:
            if run:
                runs.append(run)
            run = 0
        else:
            run += 1
    return runs


def test_task_farm_works_then_post_processes_again_and_again(tmp_path: Path) -> None:
    """The task farm of the real case, scaled: GPU work at ~68 % duty, then post-processing
    with the GPU idle, repeated; the process stays on the GPU throughout."""
    readings, _ = run_and_sample(
        tmp_path, "task-farm", 1, duration_s=33, phase_busy_s=6, phase_idle_s=5
    )
    u = util(readings, 0)
    runs = _idle_runs(u)
    assert len(runs) == 2 and all(r >= 4 for r in runs)  # the third phase is the tail
    busy = [v for v in u if v > 5]
    assert 60 <= statistics.mean(busy) <= 76
    assert all(r[0].processes for r in readings[:-1])
    assert min(mem_frac(readings, 0)) >= 0.5


def test_task_farm_keeps_its_core_busy_the_whole_time(tmp_path: Path) -> None:
    clock = SamplingClock()
    create_gpus(tmp_path, 1, clock=clock)
    spun: list[float] = []

    def spin(seconds: float) -> None:
        spun.append(seconds)
        clock.sleep(seconds)

    dev = VirtualGpuDevice.open(tmp_path, 0, clock=clock)
    run_pattern("task-farm", [dev], DemoParams(duration_s=12), clock, spin=spin)
    assert sum(spun) == pytest.approx(12.0)


def test_ranks_share_one_gpu_while_the_others_hold_a_context(tmp_path: Path) -> None:
    """Four ranks, none bound to its own GPU: all run on GPU 0; GPUs 1-3 hold one rank's
    0.4 GiB context each (a process, memory) and run no kernel."""
    readings, devices = run_and_sample(tmp_path, "ranks-share-gpu", 4, duration_s=10, ranks=4)
    assert statistics.mean(util(readings, 0)) > 90
    assert all(len(r[0].processes) == 4 for r in readings[:-1])
    for gpu in (1, 2, 3):
        assert max(util(readings, gpu)) == 0.0
        assert all(len(r[gpu].processes) == 1 for r in readings[:-1])
        assert all(r[gpu].memory_used_bytes == int(0.4 * 1024**3) for r in readings[:-1])
    # The ranks are real processes, and they are gone (and off the GPUs) at the end.
    pids = {p.pid for p in readings[0][0].processes}
    assert len(pids) == 4 and os.getpid() not in pids
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid)
    final = VirtualGpuSource(tmp_path).sample([d.uuid for d in devices])
    assert all(r.processes == () for r in final)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_busy_empty_is_busy_at_a_quarter_of_the_power_limit(tmp_path: Path) -> None:
    """The A100 of the real case: 99 % duty at 109 W of 400 W, no SM activity reported."""
    clock = SamplingClock()
    create_gpus(tmp_path, 1, model="a100", clock=clock)
    source = VirtualGpuSource(tmp_path, clock=clock)
    uuids = [g.uuid for g in source.list_gpus()]
    readings: list[list[GpuSample]] = []
    clock.on_read = lambda: readings.append(list(source.sample(uuids)))
    source.sample(uuids)
    dev = VirtualGpuDevice.open(tmp_path, 0, clock=clock)
    run_pattern("busy-empty", [dev], DemoParams(seed=3, duration_s=10), clock)
    assert statistics.mean(util(readings, 0)) > 90
    limit = dev.info.power_limit_w or 0.0
    power = [r[0].power_w or 0.0 for r in readings[:-1]]
    assert max(power) < 0.35 * limit and min(power) > 0.2 * limit
    assert all(r[0].sm_active_pct is None for r in readings)  # an A100: no GPM metrics
    assert max(mem_frac(readings, 0)) <= 0.1


def test_exit_code_is_the_workloads_status(tmp_path: Path) -> None:
    """A task whose last stage fails exits with the status asked for, after its work."""
    create_gpus(tmp_path, 1)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "slurm_gpu.demo", "task-farm", "--gpus", "0"]
    argv += ["--virtual-dir", str(tmp_path), "--duration", "0.3", "--exit-code", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "demo task-farm done" in proc.stdout
    assert "exiting 1 as asked" in proc.stderr
