"""Prolog and epilog (slurm_gpu.hooks), run as slurmd runs them: a subprocess with Slurm's
environment, real virtual GPUs and a real detached sampler."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.capture.spool import JobSpool, read_pidfile, read_record
from slurm_gpu.cli.admin import cli as admin_cli
from slurm_gpu.hooks.common import (
    JobEnv,
    render_wrapper,
    short_hostname,
    wrapper_template,
)
from slurm_gpu.hooks.epilog import is_our_sampler
from slurm_gpu.telemetry.virtual_device import create_gpus

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")


@pytest.fixture()
def site(tmp_path: Path) -> dict[str, object]:
    vdir = tmp_path / "vgpu"
    infos = create_gpus(vdir, 4)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
        f'log_file = "{tmp_path}/log/hooks.log"\n'
        f'[telemetry]\nbackend = "virtual"\nvirtual_dir = "{vdir}"\ninterval_s = 0.1\n'
        "checkpoint_interval_s = 1\n[hooks]\nsampler_stop_timeout_s = 3\n"
    )
    return {"tmp": tmp_path, "cfg": cfg, "infos": infos, "vdir": vdir}


def run_hook(site: dict[str, object], hook: str, job: str, **env: str) -> float:
    full = {
        "SLURM_GPU_CONFIG": str(site["cfg"]),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_UID": "0",
        "SLURM_JOB_USER": "root",
        **env,
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_gpu.hooks", hook], env=full, timeout=60, check=False
    )
    assert proc.returncode == 0
    return time.monotonic() - t0


def paths_of(site: dict[str, object], job: str) -> JobSpool:
    return JobSpool(f"{site['tmp']}/spool", job, short_hostname())


def log_text(site: dict[str, object]) -> str:
    return Path(f"{site['tmp']}/log/hooks.log").read_text()


def wait_for(path: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_prolog_then_epilog_seals_a_complete_record(site: dict[str, object]) -> None:
    run_hook(site, "prolog", "101", SLURM_JOB_GPUS="1,3", CUDA_VISIBLE_DEVICES="1,3")
    paths = paths_of(site, "101")
    assert stat.S_IMODE(os.stat(paths.job_dir).st_mode) == 0o700
    found = read_pidfile(paths.pid)
    assert found is not None
    pid = found[0]
    assert is_our_sampler(pid, found[1], "101")
    # Detached: its own session, not a child of anything we wait for.
    assert os.getsid(pid) == pid
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"SLURM_JOB_ID" not in environ
    infos = site["infos"]
    owner = json.loads(Path(f"{site['tmp']}/spool/owners/{infos[1].uuid}.json").read_text())  # type: ignore[index]
    assert owner["job_id"] == "101"
    wait_for(paths.state)
    run_hook(site, "epilog", "101")
    record = read_record(paths.record)
    assert record.complete
    assert [g.info.uuid for g in record.gpus] == [infos[1].uuid, infos[3].uuid]  # type: ignore[index]
    assert record.gpus[0].samples >= 10
    assert not os.path.exists(paths.pid)
    assert not os.path.exists(f"{site['tmp']}/spool/owners/{infos[1].uuid}.json")  # type: ignore[index]
    assert stat.S_IMODE(os.stat(paths.record).st_mode) == 0o600
    text = log_text(site)
    assert "job=101 prolog: sampler" in text
    assert "job=101 epilog: sampler stopped; record sealed by the sampler" in text


def test_job_without_gpus_gets_no_sampler(site: dict[str, object]) -> None:
    run_hook(site, "prolog", "102", SLURM_JOB_GPUS="", CUDA_VISIBLE_DEVICES="NoDevFiles")
    assert not os.path.exists(paths_of(site, "102").job_dir)
    run_hook(site, "epilog", "102")
    text = log_text(site)
    assert "job=102 prolog: no GPU allocated on this node; no sampler" in text
    assert "job=102 epilog: no spool for this job" in text


def test_killed_sampler_is_recovered_from_checkpoint(site: dict[str, object]) -> None:
    run_hook(site, "prolog", "103", SLURM_JOB_GPUS="0")
    paths = paths_of(site, "103")
    wait_for(paths.state)
    time.sleep(0.5)  # some readings after the checkpoint, to come from the spool tail
    pid = read_pidfile(paths.pid)[0]  # type: ignore[index]
    os.kill(pid, signal.SIGKILL)
    run_hook(site, "epilog", "103")
    record = read_record(paths.record)
    assert not record.complete
    assert "sampler_not_running" in record.notes and "recovered" in record.notes
    assert record.gpus[0].samples >= 10
    assert "job=103 epilog: sampler not_running; record recovered" in log_text(site)


def test_hung_sampler_is_killed_and_recovered(site: dict[str, object]) -> None:
    run_hook(site, "prolog", "104", SLURM_JOB_GPUS="2")
    paths = paths_of(site, "104")
    wait_for(paths.state)
    pid = read_pidfile(paths.pid)[0]  # type: ignore[index]
    os.kill(pid, signal.SIGSTOP)  # a hung sampler: SIGTERM has no effect
    run_hook(site, "epilog", "104")
    record = read_record(paths.record)
    assert not record.complete and "sampler_killed" in record.notes
    assert (
        not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    )
    assert "job=104 epilog: sampler killed; record recovered" in log_text(site)


def test_reused_pid_is_never_signalled(site: dict[str, object]) -> None:
    paths = paths_of(site, "105")
    paths.create_dir()
    victim = subprocess.Popen(["sleep", "30"])
    try:
        Path(paths.pid).write_text(f"{victim.pid} 1\n")
        run_hook(site, "epilog", "105")
        assert victim.poll() is None, "the epilog signalled a process that is not our sampler"
    finally:
        victim.kill()
        victim.wait()
    assert "job=105 epilog: sampler not_running" in log_text(site)


def test_sampler_gone_before_first_reading_still_leaves_a_record(site: dict[str, object]) -> None:
    paths = paths_of(site, "106")
    paths.create_dir()
    uuid = site["infos"][0].uuid  # type: ignore[index]
    Path(paths.job_dir, f"{paths.hostname}.owner.json").write_text(json.dumps({"gpus": [uuid]}))
    run_hook(site, "epilog", "106")
    record = read_record(paths.record)
    assert [g.info.uuid for g in record.gpus] == [uuid]
    assert "no_samples" in record.notes and "sampler_not_started" in record.notes


def test_broken_config_logs_with_job_id_and_exits_zero(site: dict[str, object]) -> None:
    cfg = Path(str(site["cfg"]))
    cfg.write_text(cfg.read_text() + "\n[telemetry\nbroken = = =\n")
    run_hook(site, "prolog", "107", SLURM_JOB_GPUS="0")
    run_hook(site, "epilog", "107")
    text = log_text(site)
    assert "job=107 prolog: configuration unusable" in text
    assert "job=107 epilog: configuration unusable" in text


def test_missing_virtual_gpus_logged_not_fatal(site: dict[str, object]) -> None:
    shutil.rmtree(str(site["vdir"]))
    run_hook(site, "prolog", "108", SLURM_JOB_GPUS="0")
    run_hook(site, "epilog", "108")
    text = log_text(site)
    assert "job=108 prolog: failed: TelemetryUnavailableError" in text


def test_hook_budget_is_enforced(site: dict[str, object]) -> None:
    cfg = Path(str(site["cfg"]))
    cfg.write_text(
        cfg.read_text().replace("sampler_stop_timeout_s = 3", "sampler_stop_timeout_s = 30")
        + "hook_timeout_s = 1\n"
    )
    run_hook(site, "prolog", "109", SLURM_JOB_GPUS="0")
    paths = paths_of(site, "109")
    wait_for(paths.state)
    pid = read_pidfile(paths.pid)[0]  # type: ignore[index]
    os.kill(pid, signal.SIGSTOP)
    try:
        took_s = run_hook(site, "epilog", "109")
        text = log_text(site)
        assert "job=109 epilog: timed out, gave up" in text
        # The hook's own measure of when it gave up: at its 1 s budget (an alarm), not after
        # the 30 s it would wait for the stopped sampler.
        logged = re.search(r"job=109 epilog: timed out, gave up \(([0-9.]+)s\)", text)
        assert logged is not None and float(logged.group(1)) < 2.0, text
        assert took_s < 30.0, f"the epilog ran {took_s:.1f} s: its 1 s budget was not applied"
    finally:
        os.kill(pid, signal.SIGKILL)


def test_unknown_hook_name_exits_zero(site: dict[str, object]) -> None:
    run_hook(site, "bogus", "110")
    assert "job=110 bogus: unknown hook" in log_text(site)


def test_job_env_parsing() -> None:
    env = JobEnv.from_environ(
        {"SLURM_JOB_ID": "12", "SLURM_JOB_UID": "1001", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"}
    )
    assert (env.job_id, env.uid, env.cpus_on_node) == ("12", 1001, 8)
    bad = JobEnv.from_environ({"SLURM_JOB_ID": "1;rm", "SLURM_JOB_UID": "x"})
    assert bad.job_id is None and bad.uid is None


# --------------------------------------------------------------------------- wrappers


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_repository_wrappers_match_the_template(hook: str) -> None:
    path = REPO / hook / f"slurm-gpu-{hook}"
    assert path.read_text() == wrapper_template(hook)
    assert os.access(path, os.X_OK)


def test_render_rejects_quotes() -> None:
    with pytest.raises(ValueError, match="quote"):
        render_wrapper(wrapper_template("prolog"), python="/x'y", config="/c", timeout_s=5)


def test_hooks_install_renders_absolute_paths(tmp_path: Path, site: dict[str, object]) -> None:
    dest = tmp_path / "hooks"
    result = CliRunner().invoke(
        admin_cli, ["hooks", "install", "--dest", str(dest), "--config", str(site["cfg"])]
    )
    assert result.exit_code == 0, result.output
    for hook in ("prolog", "epilog"):
        script = dest / f"slurm-gpu-{hook}"
        text = script.read_text()
        assert stat.S_IMODE(script.stat().st_mode) == 0o755
        assert not re.search(r"@[A-Z_]+@", text.split("\n", 3)[-1])
        assert f"'{sys.executable}' -I -m slurm_gpu.hooks {hook}" in text
        assert f"SLURM_GPU_CONFIG='{site['cfg']}'" in text
        assert "timeout -k 2 25 " in text  # hook_timeout_s (20) + 5 s backstop
        assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
        if shutil.which("shellcheck"):
            assert subprocess.run(["shellcheck", str(script)], check=False).returncode == 0


def test_installed_wrapper_runs_and_exits_zero(tmp_path: Path, site: dict[str, object]) -> None:
    dest = tmp_path / "hooks"
    CliRunner().invoke(
        admin_cli, ["hooks", "install", "--dest", str(dest), "--config", str(site["cfg"])]
    )
    # Slurm gives hooks no PATH.
    env = {"SLURM_JOB_ID": "111", "SLURM_JOB_GPUS": "0", "SLURM_JOB_UID": "0"}
    assert subprocess.run([str(dest / "slurm-gpu-prolog")], env=env, check=False).returncode == 0
    assert subprocess.run([str(dest / "slurm-gpu-epilog")], env=env, check=False).returncode == 0
    assert read_record(paths_of(site, "111").record).gpus


def test_spool_files_carry_slurms_node_name(site: dict[str, object]) -> None:
    run_hook(site, "prolog", "112", SLURM_JOB_GPUS="0", SLURMD_NODENAME="gpu-node7")
    paths = JobSpool(f"{site['tmp']}/spool", "112", "gpu-node7")
    wait_for(paths.state)
    run_hook(site, "epilog", "112", SLURMD_NODENAME="gpu-node7")
    assert read_record(paths.record).hostname == "gpu-node7"
    assert JobEnv.from_environ({"SLURMD_NODENAME": "../x"}).spool_hostname() == short_hostname()


def test_epilog_names_the_samplers_command_line_marker() -> None:
    from slurm_gpu.hooks import epilog
    from slurm_gpu.hooks.sampler import CMDLINE_MARKER

    assert epilog.CMDLINE_MARKER == CMDLINE_MARKER


@pytest.mark.parametrize("pidfd", [True, False])
def test_wait_gone_returns_when_the_process_exits(
    pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_gpu.hooks import epilog

    if not pidfd:
        monkeypatch.setattr(epilog, "_pidfd", lambda pid: None)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        assert not epilog.wait_gone(proc.pid, 0.05)  # still running: times out
        assert epilog.wait_gone(proc.pid, 10.0)  # a zombie counts as gone
    finally:
        proc.kill()
        proc.wait()
    assert epilog.wait_gone(proc.pid, 1.0)  # reaped: gone at once


def test_epilog_normal_path_does_not_import_the_record_codecs() -> None:
    code = (
        "import sys, slurm_gpu.hooks.epilog, slurm_gpu.config;"
        "print(sorted(m for m in ('slurm_gpu.records', 'slurm_gpu.capture.aggregate',"
        " 'slurm_gpu.capture.recordcodec', 'slurm_gpu.capture.spool') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_next_prolog_reaps_a_sampler_whose_epilog_never_came(site: dict[str, object]) -> None:
    """Job 301's epilog never reaches its sampler; job 302 gets the same GPU, so 301 has
    ended (gres GPUs are exclusive): 302's prolog stops and seals 301's sampler."""
    run_hook(site, "prolog", "301", SLURM_JOB_GPUS="2")
    old = paths_of(site, "301")
    wait_for(old.state)
    found = read_pidfile(old.pid)
    assert found is not None
    run_hook(site, "prolog", "302", SLURM_JOB_GPUS="2")
    assert not is_our_sampler(found[0], found[1], "301"), "the stale sampler still runs"
    assert read_record(old.record).job_id == "301"
    assert not os.path.exists(old.pid)
    infos = site["infos"]
    owner = json.loads(Path(f"{site['tmp']}/spool/owners/{infos[2].uuid}.json").read_text())  # type: ignore[index]
    assert owner["job_id"] == "302"
    assert "job=302 GPU still claimed by an ended job; reaped its sampler: job 301" in log_text(
        site
    )
    run_hook(site, "epilog", "302")
    assert read_record(paths_of(site, "302").record).job_id == "302"


def test_reaping_can_be_switched_off_for_shared_gpus(site: dict[str, object]) -> None:
    cfg = Path(str(site["cfg"]))
    cfg.write_text(cfg.read_text().replace("[hooks]\n", "[hooks]\nreap_stale_samplers = false\n"))
    run_hook(site, "prolog", "311", SLURM_JOB_GPUS="1")
    first = paths_of(site, "311")
    wait_for(first.state)
    found = read_pidfile(first.pid)
    assert found is not None
    run_hook(site, "prolog", "312", SLURM_JOB_GPUS="1")
    assert is_our_sampler(found[0], found[1], "311"), "a sharing job's sampler was stopped"
    run_hook(site, "epilog", "311")
    run_hook(site, "epilog", "312")
    assert read_record(first.record).job_id == "311"


def test_a_sampler_on_other_gpus_is_left_alone(site: dict[str, object]) -> None:
    run_hook(site, "prolog", "321", SLURM_JOB_GPUS="0")
    first = paths_of(site, "321")
    wait_for(first.state)
    found = read_pidfile(first.pid)
    assert found is not None
    run_hook(site, "prolog", "322", SLURM_JOB_GPUS="3")
    assert is_our_sampler(found[0], found[1], "321")
    run_hook(site, "epilog", "322")
    run_hook(site, "epilog", "321")
