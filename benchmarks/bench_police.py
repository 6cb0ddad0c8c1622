"""One pass of the live policy over 10,000 running jobs held in a real Prometheus.

The exporter's series for the jobs (``gen_live_openmetrics.py``: 2 GPUs each, one job in a
hundred with never-used GPUs) are loaded with ``promtool tsdb create-blocks-from openmetrics``
into a throwaway Prometheus on loopback. Measured: ``prometheus.livejobs.live_jobs`` (the two
instant queries and building the jobs), and a whole ``live.police.run_pass`` (live data,
squeue through the command-runner seam answering all 10,000 jobs, the store's past actions in
SQLite, decisions, the warnings written by ``DirMailer``, every action recorded). Wall and
process CPU time; Prometheus' own CPU is not in the latter. Target: <= 10 s for the pass.
Prints a Markdown section for docs/performance.md. Needs prometheus and promtool.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from gen_live_openmetrics import write

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.live.police import PoliceOptions, run_pass
from slurm_gpu.live.policy import PolicyConfig
from slurm_gpu.notify.transport import DirMailer
from slurm_gpu.prometheus.client import PrometheusClient
from slurm_gpu.prometheus.livejobs import live_jobs
from slurm_gpu.store import Store

TARGET_S = 10.0


class Squeue:
    def __init__(self, jobs: int) -> None:
        self.out = "".join(
            f"{100000 + j}|user{j % 997}|acct{j % 37}|gpu|normal|node{j:05d}\n" for j in range(jobs)
        ).encode()

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        return CommandResult(0, self.out, "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--gpus", type=int, default=2)
    a = p.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    assert prometheus and promtool, "install prometheus (make deps)"
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        om = Path(tmp) / "live.om"
        with om.open("w") as fh:
            write(fh, a.jobs, a.gpus, 100, now)
        t0 = time.perf_counter()
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), f"{tmp}/data"],
            check=True,
            capture_output=True,
        )
        load_s = time.perf_counter() - t0
        (Path(tmp) / "prometheus.yml").write_text("global: {scrape_interval: 1m}\n")
        port = free_port()
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp}/prometheus.yml",
                f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "Prometheus did not start"
                    time.sleep(0.5)
            client = PrometheusClient(url, 60.0)
            t0, c0 = time.perf_counter(), time.process_time()
            jobs = live_jobs(client)
            view_s, view_cpu = time.perf_counter() - t0, time.process_time() - c0
            assert len(jobs) == a.jobs, len(jobs)
            store = Store.open(f"sqlite:///{tmp}/store.db")
            opts = PoliceOptions("", 60.0, "example.org", "slurm-gpu@example.org", ("ops@x.org",))
            cfg = PolicyConfig(idle_s=3600.0, max_sample_age_s=120.0, user_interval_s=3600.0)
            mailer = DirMailer(f"{tmp}/mail")
            t0, c0 = time.perf_counter(), time.process_time()
            result = run_pass(
                lambda: live_jobs(client),
                Squeue(a.jobs),
                store.engine,
                mailer,
                cfg,
                opts,
                time.time(),
            )
            pass_s, pass_cpu = time.perf_counter() - t0, time.process_time() - c0
            store.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    warned = sum(1 for d in result.done if d.action == "warned")
    series = a.jobs * (2 + a.gpus * 7)
    print(f"## Live policy: one pass over {a.jobs:,} running jobs (`benchmarks/bench_police.py`)\n")
    print(
        f"{a.jobs} running jobs x {a.gpus} GPUs ({series:,} series) loaded into Prometheus "
        f"2.42 with `promtool tsdb create-blocks-from openmetrics` ({load_s:.1f} s); "
        f"one job in 100 holds never-used GPUs.\n"
    )
    print("| measure | wall | CPU (this process) |")
    print("|---|---|---|")
    print(
        f"| `live_jobs` (2 instant queries, {a.jobs} jobs built) | {view_s:.2f} s | "
        f"{view_cpu:.2f} s |"
    )
    print(
        f"| whole pass: data, squeue, store, decisions, {warned} warnings mailed and "
        f"recorded | {pass_s:.2f} s | {pass_cpu:.2f} s |"
    )
    print(f"\nTarget <= {TARGET_S:g} s per pass: {'met' if pass_s <= TARGET_S else 'NOT met'}.")


if __name__ == "__main__":
    main()
