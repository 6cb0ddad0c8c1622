"""Fault injection on the test cluster's real Prometheus: ``slurm-gpu police`` never acts on a
busy, stale, forged or misattributed job, and still acts on an idle one (issue 25).

Each test breaks one thing for real (Prometheus stopped and started again mid-idle and
mid-busy; the node's exporter killed or hung with SIGSTOP; a job's sampler stopped so its
series freeze while scrapes succeed; a forged target serving another user's job; an exporter
whose timestamps are 5 minutes off; a job's series naming a GPU Slurm did not allocate it; an
idle array) and restores it in a ``finally`` before the test ends. The policy runs as a real
``slurm-gpu police --json`` pass (real ``squeue``, ``scontrol``, ``scancel``), from the code
at ``$SLURM_GPU_POLICE_CODE`` (default: this checkout), with the cluster's configuration plus
test-sized windows and its own SQLite store, mails written to a directory. Pointing
``SLURM_GPU_POLICE_CODE`` at an older checkout shows which of these the old policy failed.

On a running cluster, without restarting it: ``SLURM_GPU_TC_NO_START=1 .venv/bin/pytest
tests/integration/test_police_faults_cluster.py`` (``conftest.cluster``). The node's exporter
must run code that publishes ``gpu_index`` (a cluster started from an older checkout keeps its
exporter: restart it), or every job is a ``mismatch``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import slurmtools

from slurm_gpu.config import load_settings
from slurm_gpu.prometheus.client import PrometheusClient

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CODE = os.environ.get("SLURM_GPU_POLICE_CODE", str(REPO))
EXPORTER_URL = "http://127.0.0.1:9817/metrics"
SHAPES_URL = "http://127.0.0.1:9818/metrics"


# ------------------------------------------------------------------------ the cluster's parts


def prometheus() -> PrometheusClient:
    live = load_settings(str(slurmtools.slurm_gpu_config_path())).live
    return PrometheusClient(live.prometheus_url, 5.0)


def _pidfile(name: str) -> Path:
    return slurmtools.tc_root() / "run" / f"{name}.pid"


def _pid(name: str) -> int:
    return int(_pidfile(name).read_text().strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        return "X"
    return "?"


def _http_ok(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
    except OSError:
        return False
    return True


READY = {
    "prometheus": "http://127.0.0.1:9190/-/ready",
    "exporter": EXPORTER_URL,
    "test-shapes": SHAPES_URL,
}


def wait_until(what: str, fn: Callable[[], Any], timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)


@contextmanager
def stopped(name: str) -> Iterator[None]:
    """The daemon of ``run/<name>.pid`` terminated, then started again exactly as it ran (its
    argv, working directory and user, a new pid file, its log appended), and answering."""
    pid = _pid(name)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    cwd = os.readlink(f"/proc/{pid}/cwd")
    uid = Path(f"/proc/{pid}").stat().st_uid
    os.kill(pid, signal.SIGTERM)
    try:
        wait_until(f"{name} to stop", lambda: not _alive(pid), timeout_s=60)
        yield
    finally:
        if not _alive(_pid(name)):
            import pwd

            user = pwd.getpwuid(uid).pw_name
            prefix = (
                []
                if uid == 0
                else ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]
            )
            log = slurmtools.tc_root() / "log" / f"{name}.log"
            with log.open("ab") as fh:
                subprocess.Popen(
                    [
                        "setsid",
                        "sh",
                        "-c",
                        'echo $$ >"$1"; shift; exec "$@"',
                        "sh",
                        str(_pidfile(name)),
                        *prefix,
                        *(a.decode() for a in argv),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    start_new_session=True,
                )
        wait_until(f"{name} to answer again", lambda: _http_ok(READY[name]), timeout_s=120)


@contextmanager
def hung(pid: int) -> Iterator[None]:
    """``pid`` stopped with SIGSTOP (it holds its socket and answers nothing), then SIGCONT."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture(autouse=True)
def restore_on_sigterm() -> Iterator[None]:
    """A SIGTERM (a timeout around the run) unwinds the test like Ctrl-C, so the ``finally``
    that restores a stopped daemon runs; Python's default would end the process at once."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------- the policy


# Every target of the cluster's Prometheus is 127.0.0.1: the node is its target label `node`.
# (A checkout whose settings do not know the key, such as the code before issue 25, gets none.)
_TARGET_LABEL = (
    'police_target_label = "node"\n'
    if "police_target_label" in (Path(CODE) / "slurm_gpu/config/live.py").read_text()
    else ""
)


@pytest.fixture(scope="module")
def police_config() -> Iterator[Path]:
    """The cluster's configuration, test-sized policy windows and a store of its own."""
    base = slurmtools.slurm_gpu_config_path().read_text()
    root = slurmtools.tc_root()
    store = root / "police-faults.db"
    path = root / "police-faults.toml"
    text = base.replace(
        "[live]\n",
        "[live]\n"
        "police_grace_s = 0\npolice_idle_s = 60\npolice_max_sample_age_s = 30\n"
        "police_coverage_min = 0.5\npolice_user_interval_s = 0\n"
        "police_cancel = true\npolice_cancel_after_warnings = 1\npolice_cancel_grace_s = 0\n"
        'police_admin_emails = ["admin@localhost"]\n' + _TARGET_LABEL,
        1,
    ).replace("[store]\n", f'[store]\nurl = "sqlite:///{store}"\n', 1)
    path.write_text(_dedupe(text) + "\n")
    os.chmod(path, 0o644)
    _cli(path, "store", "migrate")
    try:
        yield path
    finally:
        path.unlink()
        store.unlink(missing_ok=True)


def _dedupe(text: str) -> str:
    # The cluster's own file may already set police_target_label; keep the first.
    out, seen = [], False
    for ln in text.splitlines():
        if ln.startswith("police_target_label"):
            if seen:
                continue
            seen = True
        out.append(ln)
    return "\n".join(out)


def variant(config: Path, key: str, value: str) -> Path:
    """A copy of ``config`` with one [live] key changed (root's, 0644, next to it)."""
    path = config.with_name(f"police-faults-{key}.toml")
    lines = [
        f"{key} = {value}" if ln.startswith(f"{key} =") else ln
        for ln in config.read_text().splitlines()
    ]
    path.write_text("\n".join(lines) + "\n")
    os.chmod(path, 0o644)
    return path


def _cli(config: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.path.insert(0, {CODE!r}); from slurm_gpu.cli.admin import main; main()"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(slurmtools.venv_python()), "-c", code, "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=check,
        cwd="/",
        env=env,
    )


def police(config: Path, mail_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """One pass: (exit code, its --json output, or {} when it printed none)."""
    proc = _cli(config, "police", "--json", "--mail-dir", str(mail_dir), *args, check=False)
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        out = {}
    if proc.returncode != 0:
        out = {**out, "stderr": proc.stderr[-2000:]}  # shown by the assertion that fails
    return proc.returncode, out


def decision(out: dict[str, Any], job_id: str) -> dict[str, Any] | None:
    found = [d for d in out.get("decisions", []) if d["job_id"] == job_id]
    return found[0] if found else None


def acted(out: dict[str, Any], job_id: str) -> list[dict[str, Any]]:
    return [d for d in out.get("decisions", []) if d["job_id"] == job_id and d["action"] != "skip"]


def has_series(metric: str, job_id: str) -> bool:
    return any(s.labels.get("job_id") == job_id for s in prometheus().query(metric))


def submit(job_dir: Path, script: str, user: str = "sgtest1", *extra: str) -> str:
    return slurmtools.submit(
        script,
        user=user,
        args=[
            f"--chdir={job_dir}",
            f"--output={job_dir}/%j.out",
            "--gres=gpu:1",
            "--time=10",
            f"--export=ALL,SLURM_GPU_CONFIG={slurmtools.slurm_gpu_config_path()}",
            *extra,
        ],
    )


def healthy_after(seconds: int) -> str:
    """A job idle for ``seconds`` (start-up), then busy (the demo's ``healthy``, 90-98 %)."""
    return (
        f"#!/bin/sh\nsleep {seconds}\nexec {slurmtools.venv_python()} -m slurm_gpu.demo healthy "
        "--duration 400\n"
    )


IDLE = "#!/bin/sh\nsleep 600\n"


@pytest.fixture
def mail_dir(tmp_path: Path) -> Path:
    return tmp_path / "mail"


def _cancel(*jobs: str) -> None:
    for job in jobs:
        slurmtools.run_as(None, ["scancel", job], check=False)


# ------------------------------------------------------------------------------- the tests


def test_prometheus_restarted_while_the_job_turns_busy_never_acts_on_it(
    job_dir: Path, police_config: Path, mail_dir: Path
) -> None:
    """Issue 25 item 1: stopped during the job's start-up idle, Prometheus answers the stale
    ``idle_since`` for 5 minutes after its restart while the GPU works at 90+ %."""
    job = submit(job_dir, healthy_after(25))
    try:
        started = time.monotonic()
        wait_until(
            "the job's idle_since series",
            lambda: has_series("slurm_gpu_gpu_idle_since_timestamp_seconds", job),
            timeout_s=60,
        )
        with stopped("prometheus"):
            time.sleep(25)  # the job turns busy while Prometheus is down
        judged_busy, unaccounted = False, 0
        while time.monotonic() - started < 170:  # past police_idle_s, inside the lookback
            rc, out = police(police_config, mail_dir)
            assert rc == 0, out
            assert acted(out, job) == [], f"acted on a busy job: {acted(out, job)}"
            d = decision(out, job)
            unaccounted += d is None
            judged_busy |= d is not None and d.get("status") == "judged"
            time.sleep(5)
        assert unaccounted == 0, f"the running job was left out of {unaccounted} pass(es)"
        assert judged_busy, "the busy job was never judged (busy) after the restart"
        assert slurmtools.squeue_state(job) == "RUNNING"
    finally:
        _cancel(job)


def test_prometheus_restarted_mid_idle_acts_on_nothing_while_down_then_warns(
    job_dir: Path, police_config: Path, mail_dir: Path
) -> None:
    job = submit(job_dir, IDLE)
    try:
        wait_until(
            "the job's series",
            lambda: has_series("slurm_gpu_job_last_sample_timestamp_seconds", job),
            timeout_s=60,
        )
        with stopped("prometheus"):
            rc, out = police(police_config, mail_dir)
            assert rc == 7 and "decisions" not in out, "a pass without Prometheus must not act"
            time.sleep(20)

        def warned() -> bool:
            rc, out = police(police_config, mail_dir)
            assert rc == 0
            return any(d["action"] == "warn" for d in acted(out, job))

        wait_until("the idle job warned once Prometheus is back", warned, timeout_s=240)
    finally:
        _cancel(job)


@pytest.mark.parametrize("fault", ["hung", "killed"])
def test_a_dead_or_hung_exporter_leaves_its_jobs_listed_and_untouched(
    fault: str, job_dir: Path, police_config: Path, mail_dir: Path
) -> None:
    """Issue 25 item 5: the jobs of a node whose exporter is down were left out without a word,
    and ``slurm-gpu live`` said "No running GPU job"."""
    job = submit(job_dir, IDLE)
    try:
        wait_until(
            "the job's series",
            lambda: has_series("slurm_gpu_job_last_sample_timestamp_seconds", job),
            timeout_s=60,
        )
        time.sleep(65)  # past police_idle_s: with data, the job would be warned
        fault_cm = hung(_pid("exporter")) if fault == "hung" else stopped("exporter")
        with fault_cm:
            wait_until(
                "the job's series to go",
                lambda: not has_series("slurm_gpu_job_last_sample_timestamp_seconds", job),
                timeout_s=60,
            )
            rc, out = police(police_config, mail_dir)
            assert rc == 0, out
            assert acted(out, job) == []
            d = decision(out, job)
            assert d is not None, "the running job is not accounted for"
            assert d.get("status") == "no_data" and "no live data from" in d.get("reason", ""), d
            rows = json.loads(_cli(police_config, "live", "--json").stdout)
            [row] = [r for r in rows if r["job_id"] == job]
            assert [f["key"] for f in row["findings"]] == ["no_data"]
    finally:
        _cancel(job)


def _sampler_pid(job_id: str) -> int:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"slurm_gpu.hooks.sampler" in argv and job_id.encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no sampler for job {job_id}")


def test_frozen_data_are_never_acted_on(job_dir: Path, police_config: Path, mail_dir: Path) -> None:
    """The job's sampler stopped (SIGSTOP): the exporter keeps serving its last summary (for
    the cluster's stale_after_s, 30 s after its last rewrite), the scrapes succeed and the
    values do not advance. With the smallest freshness bound, 10 s, the last change Prometheus
    saw is at most one scrape (2 s) after the stop, so from 12 s on the policy must call the
    job stale (frozen), then no_data once the exporter drops it; never act on it."""
    job = submit(job_dir, IDLE)
    config = variant(police_config, "police_max_sample_age_s", "10")
    try:
        wait_until(
            "the job's series",
            lambda: has_series("slurm_gpu_job_last_sample_timestamp_seconds", job),
            timeout_s=60,
        )
        time.sleep(65)  # idle past police_idle_s: on advancing data it would be warned
        statuses = []
        with hung(_sampler_pid(job)):
            time.sleep(12)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20:
                rc, out = police(config, mail_dir)
                assert rc == 0, out
                assert acted(out, job) == [], f"acted on frozen data: {acted(out, job)}"
                d = decision(out, job)
                assert d is not None
                statuses.append((d.get("status"), d.get("reason", "")))
                time.sleep(1)
        assert any(s == "stale" and "frozen" in r for s, r in statuses), statuses
    finally:
        config.unlink(missing_ok=True)
        _cancel(job)


def _start_of(job_id: str) -> float:
    [value] = [
        s.value
        for s in prometheus().query("slurm_gpu_job_start_timestamp_seconds")
        if s.labels.get("job_id") == job_id
    ]
    return value


def allocated_gpus(job_id: str) -> tuple[int, ...]:
    """The GPU indices Slurm allocated the job on the node (``scontrol -d show job``)."""
    from slurm_gpu.live.allocation import parse_gpu_detail

    text = slurmtools.run_as(None, ["scontrol", "-d", "show", "job", job_id]).stdout
    alloc, _ = parse_gpu_detail(text)
    return alloc[job_id]["vm"]


def published_gpu_index(job_id: str) -> set[str]:
    """The ``gpu_index`` labels of the job's GPU series in Prometheus now ("": none)."""
    return {
        s.labels.get("gpu_index", "")
        for s in prometheus().query("slurm_gpu_gpu_available")
        if s.labels.get("job_id") == job_id
    }


FORGER = r"""
import http.server, sys, time
victim, user, account, start = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
index = sys.argv[5]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        now = time.time()
        # honor_labels is on for this scrape job in the running cluster: claim the node, the
        # exporters' job name and the victim's labels; a GPU never used, under the number of
        # the GPU Slurm allocated the victim (so only where the series come from tells).
        base = (f'job_id="{victim}",user="{user}",account="{account}",partition="gpu",'
                f'host="vm",node="vm",job="slurm-gpu"')
        g = base + f',gpu_uuid="GPU-forged-0000",gpu_index="{index}"'
        body = "\n".join([
            f"slurm_gpu_job_start_timestamp_seconds{{{base}}} {start}",
            f"slurm_gpu_job_last_sample_timestamp_seconds{{{base}}} {now}",
            f"slurm_gpu_gpu_available{{{g}}} 1",
            f"slurm_gpu_gpu_utilization_ratio{{{g}}} 0",
            f"slurm_gpu_gpu_busy_seconds_total{{{g}}} 0",
            f"slurm_gpu_gpu_sampled_seconds_total{{{g}}} {now - start}",
            f"slurm_gpu_gpu_idle_since_timestamp_seconds{{{g}}} {start}",
        ]) + "\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 9818), H).serve_forever()
"""


def test_a_forged_target_serving_another_users_job_is_a_mismatch_never_acted_on(
    job_dir: Path, police_config: Path, mail_dir: Path
) -> None:
    """Issue 25 item 2: an unprivileged process on a scraped port serves a 'never used' GPU
    under another user's job id; the old policy warned (and would cancel) that job."""
    victim = submit(slurmtools.user_dir("sgtest2"), healthy_after(0), "sgtest2")
    forger: subprocess.Popen[bytes] | None = None
    try:
        wait_until(
            "the victim's series",
            lambda: has_series("slurm_gpu_job_last_sample_timestamp_seconds", victim),
            timeout_s=60,
        )
        with stopped("test-shapes"):
            forger = subprocess.Popen(
                [
                    "runuser",
                    "-u",
                    "sgtest1",
                    "--",
                    "/usr/bin/python3",
                    "-I",
                    "-c",
                    FORGER,
                    victim,
                    "sgtest2",
                    "biology",
                    # The victim's own start: its real GPU's readings then cover its time.
                    str(_start_of(victim)),
                    str(allocated_gpus(victim)[0]),
                ],
                cwd="/",
            )
            try:
                wait_until(
                    "the forged series in Prometheus",
                    lambda: any(
                        s.labels.get("gpu_uuid") == "GPU-forged-0000"
                        for s in prometheus().query("slurm_gpu_gpu_sampled_seconds_total")
                    ),
                    timeout_s=60,
                )
                time.sleep(65)  # police_idle_s of forged "never used" readings
                for _ in range(3):
                    rc, out = police(police_config, mail_dir)
                    assert rc == 0, out
                    assert acted(out, victim) == [], f"acted on a forged series: {out}"
                    d = decision(out, victim)
                    assert d is not None and d.get("status") == "mismatch", d
                    # Two targets speak for the victim on vm; its GPUs are one more than
                    # Slurm allocated it there.
                    assert "2 scrape targets" in d.get("reason", "") or "allocated 1" in d.get(
                        "reason", ""
                    ), d
                    time.sleep(5)
            finally:
                forger.terminate()
                forger.wait(timeout=30)
        assert slurmtools.squeue_state(victim) == "RUNNING"
    finally:
        _cancel(victim)


def test_idle_array_tasks_get_one_mail_per_user_and_pass(
    job_dir: Path, police_config: Path, mail_dir: Path
) -> None:
    """Issue 25 item 6: a 50-task array got 50 mails in one pass (the node's 4 GPUs run 4 of
    them at a time; every task running and idle is named in the one mail)."""
    array = submit(job_dir, IDLE, "sgtest1", "--array=0-49")
    try:

        def running() -> list[str]:
            out = slurmtools.run_as(
                None, ["squeue", "-h", "-t", "R", "-j", array, "-o", "%A"], check=False
            ).stdout.split()
            return out if len(out) >= 2 else []

        tasks = wait_until("two array tasks running", running, timeout_s=120)
        time.sleep(70)
        rc, out = police(police_config, mail_dir)
        assert rc == 0, out
        warned = {d["job_id"] for d in out["decisions"] if d["action"] == "warn"}
        assert set(tasks) <= warned, (tasks, out["decisions"])
        mails = sorted(mail_dir.glob("*sgtest1*.eml"))
        assert len(mails) == 1, [m.name for m in mails]
        body = mails[0].read_text()
        assert all(f"Job {t}:" in body for t in warned)
    finally:
        _cancel(array)


@contextmanager
def skewed_exposition(shifts: Mapping[str, float]) -> Iterator[None]:
    """On the shapes' port (scraped with ``honor_labels``), each job's own exporter series as
    a node whose clock is ``shifts[job]`` seconds off, claiming the node and the exporters'
    job name."""
    from functools import partial

    from slurm_gpu.live.testshapes import shifted

    with own_exposition({job: partial(shifted, shift_s=shift) for job, shift in shifts.items()}):
        yield


@contextmanager
def own_exposition(changes: Mapping[str, Callable[[Any], Any]]) -> Iterator[None]:
    """On the shapes' port (scraped with ``honor_labels``), the own exporter series of each
    job of ``changes`` (its live summary at its newest reading) passed through its change (a
    ``LiveJob`` to a ``LiveJob``, read at each scrape), claiming the node and the exporters'
    job name."""
    import http.server
    import threading

    from slurm_gpu.live.snapshot import read_node
    from slurm_gpu.live.testshapes import last_reading, own_text, with_last_reading

    spool = str(load_settings(str(slurmtools.slurm_gpu_config_path())).paths.spool_dir)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            jobs = [
                changes[j.job_id](with_last_reading(j, last_reading(spool, j.job_id, j.host)))
                for j in read_node(spool, time.time(), 60.0).jobs
                if j.job_id in changes
            ]
            body = own_text(jobs, 'node="vm",job="slurm-gpu"').encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 9818), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_a_node_clock_5_minutes_off_is_shown_and_decides_nothing(
    job_dir: Path, police_config: Path, mail_dir: Path
) -> None:
    """Issue 25 item 3: a node 5 minutes behind made its jobs stale forever; with a bound
    above the skew a job inside its start-up grace was warned. Now the grace is Slurm's start
    time, freshness Prometheus' scrape time, and the skew is reported. Two jobs at once, one
    on a node 5 minutes behind and one 5 minutes ahead: one wait of the grace for both."""
    submitted: dict[str, float] = {}
    shifts: dict[str, float] = {}
    for shift_s in (-300.0, 300.0):
        job = submit(job_dir, IDLE)
        submitted[job], shifts[job] = time.monotonic(), shift_s
    config = variant(police_config, "police_grace_s", "120")
    try:
        wait_until(
            "both jobs' series",
            lambda: all(
                has_series("slurm_gpu_job_last_sample_timestamp_seconds", j) for j in shifts
            ),
            timeout_s=60,
        )
        with hung(_pid("exporter")), stopped("test-shapes"), skewed_exposition(shifts):
            warned_at: dict[str, float] = {}
            unaccounted = dict.fromkeys(shifts, 0)
            first = min(submitted.values())
            while time.monotonic() - first < 300 and len(warned_at) < len(shifts):
                rc, out = police(config, mail_dir)
                assert rc == 0, out
                # A warned job is done with (the policy may cancel it at the next pass).
                for job, shift_s in [(j, v) for j, v in shifts.items() if j not in warned_at]:
                    age = time.monotonic() - submitted[job]
                    if age < 110:  # inside the grace by Slurm's clock (submitted <= started)
                        assert acted(out, job) == [], f"acted inside the grace: {acted(out, job)}"
                    d = decision(out, job)
                    unaccounted[job] += d is None
                    if d is not None and d["action"] == "warn":
                        warned_at[job] = age
                        # The skew is shown: scrape time minus the node's reading time.
                        assert d["skew_s"] == pytest.approx(-shift_s, abs=30), d
                time.sleep(5)
            assert set(warned_at) == set(shifts), (
                f"idle jobs on a skewed node never judged: {set(shifts) - set(warned_at)}"
            )
            assert unaccounted == dict.fromkeys(shifts, 0), f"running jobs left out: {unaccounted}"
    finally:
        config.unlink(missing_ok=True)
        _cancel(*shifts)


def test_series_naming_a_gpu_slurm_did_not_allocate_are_a_mismatch_never_acted_on(
    job_dir: Path, police_config: Path, mail_dir: Path
) -> None:
    """Issue 25, last point: the job's own idle series, from the node's own name and the
    exporters' job, as many GPUs as Slurm allocated, but naming a GPU Slurm did not allocate
    the job (``gpu_index``): only the GPU's number tells, and the policy acted on such series
    before it read it. Served with the job's own number again, the job is judged and warned."""
    import dataclasses

    job = submit(job_dir, IDLE)
    try:
        wait_until(
            "the job's series",
            lambda: has_series("slurm_gpu_job_last_sample_timestamp_seconds", job),
            timeout_s=60,
        )
        allocated = allocated_gpus(job)
        # The node's own exporter names the GPU as Slurm does (gres.conf /dev/nvidia0-3).
        assert published_gpu_index(job) == {str(i) for i in allocated}, allocated
        other = next(i for i in range(4) if i not in allocated)
        number = [other]

        def renumbered(j: Any) -> Any:
            gpus = tuple(dataclasses.replace(g, gpu_index=number[0]) for g in j.gpus)
            return dataclasses.replace(j, gpus=gpus)

        with hung(_pid("exporter")), stopped("test-shapes"), own_exposition({job: renumbered}):
            wait_until(
                "the renumbered series in Prometheus",
                lambda: published_gpu_index(job) == {str(other)},
                timeout_s=60,
            )
            time.sleep(65)  # police_idle_s of idle readings under the other number
            for _ in range(3):
                rc, out = police(police_config, mail_dir)
                assert rc == 0, out
                assert acted(out, job) == [], f"acted on another GPU's number: {out}"
                d = decision(out, job)
                assert d is not None and d.get("status") == "mismatch", d
                assert f"name GPU(s) {other}; Slurm allocated the job" in d.get("reason", ""), d
                time.sleep(5)
            number[0] = allocated[0]
            wait_until(
                "the job's own number in Prometheus again",
                lambda: published_gpu_index(job) == {str(allocated[0])},
                timeout_s=60,
            )

            def warned() -> bool:
                rc, out = police(police_config, mail_dir)
                assert rc == 0, out
                return any(a["action"] == "warn" for a in acted(out, job))

            wait_until("the job judged and warned under its own number", warned, timeout_s=120)
        assert slurmtools.squeue_state(job) == "RUNNING"
    finally:
        _cancel(job)
