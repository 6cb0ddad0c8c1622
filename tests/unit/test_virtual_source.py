"""Virtual GPUs: the writer's counters and the source's readings, on a fake clock."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.admin import cli
from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.telemetry.base import TelemetrySource
from slurm_gpu.telemetry.virtual import SAMPLE_ORDER, VirtualGpuSource
from slurm_gpu.telemetry.virtual_device import MODELS, VirtualGpuDevice, create_gpus
from slurm_gpu.telemetry.virtual_format import STATE_FIELDS, STATE_FILE, read_state


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def vdir(tmp_path: Path, clock: FakeClock) -> Path:
    create_gpus(tmp_path / "vgpu", 2, clock=clock)
    return tmp_path / "vgpu"


def drive(
    dev: VirtualGpuDevice, clock: FakeClock, duty: float, seconds: float, **kw: float
) -> None:
    """Tick every 0.2 s for ``seconds`` at ``duty``."""
    for _ in range(round(seconds / 0.2)):
        clock.advance(0.2)
        dev.tick(duty, **kw)


def test_source_implements_protocol(vdir: Path, clock: FakeClock) -> None:
    assert isinstance(VirtualGpuSource(vdir, clock=clock), TelemetrySource)


def test_list_gpus_gives_minor_numbers_and_uuids(vdir: Path, clock: FakeClock) -> None:
    infos = VirtualGpuSource(vdir, clock=clock).list_gpus()
    assert [i.minor_number for i in infos] == [0, 1]
    assert all(i.uuid.startswith("GPU-") for i in infos)
    assert len({i.uuid for i in infos}) == 2
    assert infos[0].memory_total_bytes == MODELS["h100"].memory_total_bytes


def test_create_is_idempotent_and_keeps_uuids_and_counters(vdir: Path, clock: FakeClock) -> None:
    before = [i.uuid for i in VirtualGpuSource(vdir, clock=clock).list_gpus()]
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    dev.attach(memory_bytes=1000)
    drive(dev, clock, 1.0, 2.0)
    busy = read_state(vdir / "0" / STATE_FILE)["busy_s"]
    after = create_gpus(vdir, 3, model="a100", memory_gib=10, clock=clock)
    assert [i.uuid for i in after][:2] == before
    assert after[0].memory_total_bytes == 10 * 1024**3
    assert read_state(vdir / "0" / STATE_FILE)["busy_s"] == busy


def test_model_by_product_name(tmp_path: Path) -> None:
    (info,) = create_gpus(tmp_path / "v", 1, model="nvidia a100-sxm4-40gb")
    assert info.name == "NVIDIA A100-SXM4-40GB" and info.compute_capability == (8, 0)


def test_create_rejects_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(TelemetryUnavailableError, match="unknown virtual GPU model"):
        create_gpus(tmp_path / "v", 1, model="tpu")


def test_missing_directory_is_unavailable_with_hint(tmp_path: Path) -> None:
    with pytest.raises(TelemetryUnavailableError) as err:
        VirtualGpuSource(tmp_path / "absent")
    assert err.value.hint and "vgpu create" in err.value.hint


@pytest.mark.parametrize("duty", [0.0, 0.25, 0.5, 0.95, 1.0])
def test_duty_cycle_is_busy_delta_over_polling_interval(
    vdir: Path, clock: FakeClock, duty: float
) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    dev.attach(memory_bytes=2**30)
    source.sample([gpu])
    drive(dev, clock, duty, 3.0)
    (reading,) = source.sample([gpu])
    assert reading.utilization_pct == pytest.approx(duty * 100, abs=0.01)
    assert len(reading.utilization_samples_pct) == 15


def test_duty_cycle_counts_idle_time_after_the_writer_stopped(vdir: Path, clock: FakeClock) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    source.sample([gpu])
    drive(dev, clock, 1.0, 2.0)  # busy for 2 s ...
    clock.advance(8.0)  # ... then nobody writes for 8 s
    (reading,) = source.sample([gpu])
    assert reading.utilization_pct == pytest.approx(20.0, abs=0.01)
    clock.advance(5.0)
    (reading,) = source.sample([gpu])
    assert reading.utilization_pct == 0.0
    assert reading.utilization_samples_pct == ()
    assert reading.power_w == MODELS["h100"].idle_power_w


def test_subinterval_samples_are_only_new_ones(vdir: Path, clock: FakeClock) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    source.sample([gpu])
    drive(dev, clock, 0.5, 1.0)
    first = source.sample([gpu])[0].utilization_samples_pct
    drive(dev, clock, 1.0, 0.6)
    second = source.sample([gpu])[0].utilization_samples_pct
    assert first == (50.0,) * 5
    assert second == (100.0,) * 3


def test_energy_counter_is_monotonic_and_keeps_counting_at_idle(
    vdir: Path, clock: FakeClock
) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    e0 = source.sample([gpu])[0].energy_mj
    clock.advance(10.0)
    e1 = source.sample([gpu])[0].energy_mj
    assert e0 is not None and e1 is not None
    assert e1 - e0 == pytest.approx(MODELS["h100"].idle_power_w * 10 * 1000, rel=1e-3)
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    energies = []
    for _ in range(10):
        drive(dev, clock, 1.0, 0.4)
        energies.append(source.sample([gpu])[0].energy_mj)
    assert energies == sorted(energies)
    assert energies[-1] > e1


def test_processes_with_dead_pids_are_dropped_and_memory_freed(
    vdir: Path, clock: FakeClock
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
        dev.attach(pid=child.pid, memory_bytes=5 * 2**30)
        dev.attach(memory_bytes=2**30)
        source = VirtualGpuSource(vdir, clock=clock)
        gpu = source.list_gpus()[0].uuid
        pids = {p.pid for p in source.sample([gpu])[0].processes or ()}
        assert pids == {child.pid, os.getpid()}
    finally:
        child.kill()
        child.wait()
    reading = source.sample([gpu])[0]
    assert {p.pid for p in reading.processes or ()} == {os.getpid()}
    dev.detach()
    clock.advance(5)
    reading = source.sample([gpu])[0]
    assert reading.processes == ()
    assert reading.memory_used_bytes == 0


def test_reused_pid_is_not_taken_for_the_old_process(vdir: Path, clock: FakeClock) -> None:
    state_path = vdir / "0" / STATE_FILE
    state = read_state(state_path)
    state["processes"] = [{"pid": os.getpid(), "used_memory_bytes": 1, "start_ticks": 1}]
    state_path.write_text(json.dumps(state))
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    assert source.sample([gpu])[0].processes == ()


def test_writer_writes_state_version_2_as_one_array(vdir: Path, clock: FakeClock) -> None:
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    dev.attach(memory_bytes=1000)
    drive(dev, clock, 0.5, 1.0)
    dev.inject_xid(79)
    row = json.loads((vdir / "0" / STATE_FILE).read_text())
    assert isinstance(row, list) and row[0] == 2 and len(row) == len(STATE_FIELDS) + 1
    state = dict(zip(STATE_FIELDS, row[1:], strict=True))
    assert state["uuid"] == dev.uuid and state["busy_s"] == pytest.approx(0.5)
    assert state["processes"] == [[os.getpid(), 1000, state["processes"][0][2]]]
    assert state["xid_events"] == [[clock.now, 79]]
    assert len(state["samples"]) == 5 and state["samples"][-1] == [clock.now, 50.0]
    # The writer's own view (and read_state) is the version 1 object.
    assert read_state(vdir / "0" / STATE_FILE) == {**dev.state, "schema": 1}


def _as_version_1(path: Path) -> None:
    """Rewrite a state file as the object a writer before version 2 wrote."""
    path.write_text(json.dumps(read_state(path)))


def test_version_1_states_read_as_version_2(vdir: Path, clock: FakeClock) -> None:
    """A state written before version 2 (an object, processes and XIDs as objects) gives
    the same readings as the same state in version 2."""
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    dev.attach(memory_bytes=2**30)
    dev.set_throttle(0x4)
    v2_source = VirtualGpuSource(vdir, clock=clock)
    v1_source = VirtualGpuSource(vdir, clock=clock)
    gpu = v2_source.list_gpus()[0].uuid
    v1_source.list_gpus()
    path = vdir / "0" / STATE_FILE
    for step in range(4):
        drive(dev, clock, 0.3 + 0.2 * step, 1.0, nvlink_tx_bytes_per_s=1e9)
        if step == 2:
            dev.inject_xid(48)
            dev.add_ecc_errors(corrected=2)
        (v2,) = v2_source.sample([gpu])
        _as_version_1(path)
        assert isinstance(json.loads(path.read_text()), dict)
        (v1,) = v1_source.sample([gpu])
        assert v1 == v2 and v2.available
    assert v2.xid_events == () and v2.processes and v2.throttle_reasons == 0x4
    # A writer opened on a version 1 state goes on from its counters, in version 2.
    busy = read_state(path)["busy_s"]
    VirtualGpuDevice.open(vdir, 0, clock=clock).tick(1.0)
    assert json.loads(path.read_text())[0] == 2 and read_state(path)["busy_s"] >= busy


def test_create_keeps_a_version_1_state(vdir: Path, clock: FakeClock) -> None:
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    drive(dev, clock, 1.0, 1.0)
    path = vdir / "0" / STATE_FILE
    _as_version_1(path)
    before = path.read_text()
    create_gpus(vdir, 2, clock=clock)
    assert path.read_text() == before


def test_samples_are_built_in_the_records_field_order() -> None:
    """The source builds GpuSample positionally: its order must be the record's."""
    from slurm_gpu.records import GpuSample

    assert tuple(f.name for f in dataclasses.fields(GpuSample)) == SAMPLE_ORDER


@pytest.mark.parametrize(
    "content",
    [
        json.dumps([3, *([0] * len(STATE_FIELDS))]),  # an unknown version
        json.dumps([2, *([0] * (len(STATE_FIELDS) - 1))]),  # a value missing
        "[1, 2]",
        json.dumps({"t_s": 1.0, "busy_s": 0.0, "energy_mj": 0, "processes": [7]}),
        json.dumps({"t_s": None, "busy_s": 0.0, "energy_mj": 0}),
        '"state"',
    ],
)
def test_unknown_or_malformed_state_is_unavailable(
    vdir: Path, clock: FakeClock, content: str
) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    uuids = [i.uuid for i in source.list_gpus()]
    (vdir / "0" / STATE_FILE).write_text(content)
    broken, healthy = source.sample(uuids)
    assert not broken.available and healthy.available


@pytest.mark.parametrize("damage", ["delete_state", "corrupt_state", "delete_gpu", "not_object"])
def test_broken_gpu_is_unavailable_and_others_go_on(
    vdir: Path, clock: FakeClock, damage: str
) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    uuids = [i.uuid for i in source.list_gpus()]
    state = vdir / "0" / STATE_FILE
    if damage == "delete_state":
        state.unlink()
    elif damage == "corrupt_state":
        state.write_text('{"t_s": 12, "busy')
    elif damage == "not_object":
        state.write_text("[1, 2]")
    else:
        for f in (vdir / "0").iterdir():
            f.unlink()
        (vdir / "0").rmdir()
    broken, healthy = source.sample(uuids)
    assert broken.uuid == uuids[0] and not broken.available
    assert broken.utilization_pct is None and broken.memory_used_bytes is None
    assert healthy.available and healthy.utilization_pct == 0.0


def test_unknown_uuid_reads_as_unavailable(vdir: Path, clock: FakeClock) -> None:
    (reading,) = VirtualGpuSource(vdir, clock=clock).sample(["GPU-not-here"])
    assert not reading.available


def test_xid_events_reported_once_and_only_after_the_source_started(
    vdir: Path, clock: FakeClock
) -> None:
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    dev.inject_xid(13)  # before the source existed: belongs to an earlier job
    clock.advance(1)
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    clock.advance(1)
    dev.inject_xid(79)
    assert source.sample([gpu])[0].xid_events == (79,)
    assert source.sample([gpu])[0].xid_events == ()


def test_activity_ratios_nvlink_and_throttle(vdir: Path, clock: FakeClock) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
    first = source.sample([gpu])[0]
    drive(dev, clock, 0.5, 2.0, sm_active=0.6, tensor_active=0.5, nvlink_tx_bytes_per_s=1e9)
    dev.set_throttle(0x4)
    reading = source.sample([gpu])[0]
    assert reading.sm_active_pct == pytest.approx(30.0, abs=0.01)
    assert reading.tensor_active_pct == pytest.approx(25.0, abs=0.01)
    assert first.nvlink_tx_bytes is not None and reading.nvlink_tx_bytes is not None
    assert reading.nvlink_tx_bytes - first.nvlink_tx_bytes == pytest.approx(2e9, rel=1e-6)
    assert reading.throttle_reasons == 0x4


def test_gpu_without_gpm_reports_no_sm_activity(tmp_path: Path, clock: FakeClock) -> None:
    create_gpus(tmp_path, 1, model="a100", clock=clock)
    source = VirtualGpuSource(tmp_path, clock=clock)
    gpu = source.list_gpus()[0].uuid
    source.sample([gpu])
    clock.advance(1)
    reading = source.sample([gpu])[0]
    assert reading.sm_active_pct is None and reading.tensor_active_pct is None


def test_files_are_writable_by_other_users(vdir: Path, clock: FakeClock) -> None:
    dev = VirtualGpuDevice.open(vdir, 1, clock=clock)
    old = os.umask(0o077)
    try:
        dev.tick(0.5)
    finally:
        os.umask(old)
    assert (vdir / "1").stat().st_mode & 0o777 == 0o777
    assert (vdir / "1" / STATE_FILE).stat().st_mode & 0o777 == 0o666


def test_open_missing_gpu_has_hint(vdir: Path) -> None:
    with pytest.raises(TelemetryUnavailableError) as err:
        VirtualGpuDevice.open(vdir, 9)
    assert err.value.hint and "vgpu create" in err.value.hint


def test_vgpu_cli_create_twice_then_show(tmp_path: Path) -> None:
    runner = CliRunner()
    target = str(tmp_path / "v")
    first = runner.invoke(cli, ["vgpu", "create", "--dir", target, "--count", "2"])
    second = runner.invoke(cli, ["vgpu", "create", "--dir", target, "--count", "2"])
    assert first.exit_code == 0 and first.output == second.output
    shown = runner.invoke(cli, ["vgpu", "show", "--dir", target, "--json"])
    assert shown.exit_code == 0
    rows = json.loads(shown.output)
    assert [r["uuid"] for r in rows] == [line.split("\t")[1] for line in first.output.splitlines()]


def test_vgpu_cli_show_missing_dir_exits_7(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["vgpu", "show", "--dir", str(tmp_path / "none")])
    assert result.exit_code == 7
    assert "does not exist" in result.output


@pytest.mark.parametrize("legacy_state", [False, True])
def test_directory_taken_by_another_gpu_is_unavailable(
    tmp_path: Path, clock: FakeClock, legacy_state: bool
) -> None:
    create_gpus(tmp_path / "vgpu", 1, clock=clock)
    source = VirtualGpuSource(tmp_path / "vgpu", clock=clock)
    gpu = source.list_gpus()[0].uuid
    assert source.sample([gpu])[0].available
    for f in (tmp_path / "vgpu" / "0").iterdir():
        f.unlink()
    (tmp_path / "vgpu" / "0").rmdir()
    (other,) = create_gpus(tmp_path / "vgpu", 1, clock=clock)
    assert other.uuid != gpu
    state_path = tmp_path / "vgpu" / "0" / STATE_FILE
    state = read_state(state_path)
    assert state["uuid"] == other.uuid
    if legacy_state:  # written before states named their GPU: identity.json tells
        del state["uuid"]
        state_path.write_text(json.dumps(state))
    assert not source.sample([gpu])[0].available


def test_identity_change_is_seen_without_a_new_source(vdir: Path, clock: FakeClock) -> None:
    source = VirtualGpuSource(vdir, clock=clock)
    gpu = source.list_gpus()[0].uuid
    state_path = vdir / "0" / STATE_FILE
    state = read_state(state_path)
    del state["uuid"]  # an older writer's state: the identity is checked at every reading
    state_path.write_text(json.dumps(state))
    assert source.sample([gpu])[0].memory_total_bytes == MODELS["h100"].memory_total_bytes
    create_gpus(vdir, 2, model="a100", clock=clock)
    assert source.sample([gpu])[0].memory_total_bytes == MODELS["a100"].memory_total_bytes


def test_process_checks_survive_many_readings_and_close(vdir: Path, clock: FakeClock) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dev = VirtualGpuDevice.open(vdir, 0, clock=clock)
        dev.attach(pid=child.pid, memory_bytes=2**30)
        source = VirtualGpuSource(vdir, clock=clock)
        gpu = source.list_gpus()[0].uuid
        for _ in range(5):
            clock.advance(0.1)
            dev.tick(0.5)
            assert [p.pid for p in source.sample([gpu])[0].processes or ()] == [child.pid]
        dev.detach(pid=child.pid)
        assert source.sample([gpu])[0].processes == ()
        dev.attach(pid=child.pid, memory_bytes=2**30)
        assert [p.pid for p in source.sample([gpu])[0].processes or ()] == [child.pid]
        source.close()
        source.close()
    finally:
        child.kill()
        child.wait()
    assert source.sample([gpu])[0].processes == ()
