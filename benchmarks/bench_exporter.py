"""Exporter cost per scrape: 8 jobs x 8 GPUs on one node.

Eight real live summaries are written by real samplers (``capture.sampler.Sampler`` fed by a
fixed fake source, as a node's samplers write them), then one scrape is what the exporter
does for ``GET /metrics``: list the live directory, read and clean every summary, render the
exposition. Measured in process CPU time (``time.process_time``) over many scrapes, after a
warm-up; also one scrape through the real HTTP server on loopback (wall time, client
included). Target: <= 10 ms CPU per scrape. Prints a Markdown section for docs/performance.md.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence

from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.live.exporter import ExporterOptions, exposition, make_server
from slurm_gpu.live.peeruid import diag_uid, peer_uid
from slurm_gpu.records import GpuInfo, GpuSample, HostSample

JOBS = 8
GPUS = 8
READINGS = 40
TARGET_MS = 10.0


class _Source:
    name = "bench"

    def __init__(self, uuids: Sequence[str], clock: list[float]) -> None:
        self.uuids, self.clock = uuids, clock

    def list_gpus(self) -> Sequence[GpuInfo]:
        return [GpuInfo(uuid=u, memory_total_bytes=80 << 30) for u in self.uuids]

    def sample(self, uuids: Sequence[str]) -> Sequence[GpuSample]:
        t = self.clock[0]
        return [
            GpuSample(
                uuid=u,
                time_s=t,
                utilization_pct=float((i * 13) % 100),
                memory_used_bytes=(i + 1) << 30,
                memory_total_bytes=80 << 30,
                power_w=150.0 + i,
                energy_mj=int(t * 1e3) * (i + 1),
            )
            for i, u in enumerate(uuids)
        ]

    def close(self) -> None:
        pass


class _Host:
    method = "cgroup2"

    def sample(self, now_s: float | None = None) -> HostSample:
        t = now_s or 0.0
        return HostSample(t, t / 2, 8 << 30, 0, 0, 12, "cgroup2")

    def allocated_cores(self) -> int | None:
        return 16


def write_node(spool_dir: str, now: float) -> None:
    """JOBS live summaries of GPUS GPUs each, as their samplers write them."""
    for j in range(JOBS):
        clock = [now - READINGS * 10.0]
        uuids = tuple(f"GPU-{j:02d}{g:02d}aaaa-bbbb-cccc-dddd-eeeeeeeeeeee" for g in range(GPUS))
        opts = SamplerOptions(
            job_id=str(1000 + j),
            hostname="gpu-node-001",
            uid=1000 + j,
            gpu_uuids=uuids,
            spool_dir=spool_dir,
            interval_s=10.0,
            checkpoint_interval_s=3600.0,
            idle_threshold_pct=1.0,
            timeline_points=64,
            user=f"user{j}",
            account=f"account{j % 3}",
            partition="gpu",
        )
        sampler = Sampler(
            opts, lambda u=uuids, c=clock: _Source(u, c), _Host(), clock=lambda c=clock: c[0]
        )  # type: ignore[misc]
        sampler.open_spool()
        for _ in range(READINGS):
            sampler.read_once()
            clock[0] += 10.0
        sampler.write_live()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scrapes", type=int, default=500)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        spool = f"{tmp}/spool"
        write_node(spool, now)
        opts = ExporterOptions(spool, 3600.0)
        text = exposition(opts)
        for _ in range(20):
            exposition(opts)
        cpu_ms = []
        for _ in range(args.scrapes):
            t0 = time.process_time()
            exposition(opts)
            cpu_ms.append((time.process_time() - t0) * 1e3)
        # The HTTP scrapes go through the loopback check, as deployed (the caller's uid
        # allowed); the check itself is timed alone below.
        gated = ExporterOptions(spool, 3600.0, local_uids=frozenset({0, os.geteuid()}))
        srv = make_server(gated, "127.0.0.1", 0)
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        walls = []
        for _ in range(50):
            t0 = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            walls.append((time.perf_counter() - t0) * 1e3)
            conn.close()
        srv.shutdown()
        srv.server_close()
    diag_us, table_us, sockets = peer_check_cost()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    gpu_series = sum(
        1
        for line in text.splitlines()
        if line.startswith("slurm_gpu_gpu_") and 'gpu_uuid="' in line
    )
    cpu_ms.sort()
    median = statistics.median(cpu_ms)
    p95 = cpu_ms[int(0.95 * len(cpu_ms)) - 1]
    print("## Exporter: cost per scrape (`benchmarks/bench_exporter.py`)\n")
    print(f"{JOBS} jobs x {GPUS} GPUs on one node, {args.scrapes} scrapes after a warm-up.\n")
    print("| measure | value |")
    print("|---|---|")
    print(f"| CPU per scrape, median | {median:.2f} ms |")
    print(f"| CPU per scrape, p95 | {p95:.2f} ms |")
    print(
        f"| wall per HTTP scrape on loopback, median (client included) | "
        f"{statistics.median(walls):.2f} ms |"
    )
    print(f"| exposition size | {len(body) / 1024:.1f} KiB |")
    print(f"| loopback client's uid, netlink sock_diag lookup, median CPU | {diag_us:.0f} us |")
    print(
        f"| the same from /proc/net/tcp ({sockets} sockets on the host), median CPU | "
        f"{table_us:.0f} us |"
    )
    print(f"| series in all | {series} |")
    print(f"| series per GPU (GPU families) | {gpu_series / (JOBS * GPUS):.1f} |")
    print(f"| series per job and host (job families) | {(series - gpu_series - 3) / JOBS:.1f} |")
    print(
        f"\nTarget <= {TARGET_MS:g} ms CPU per scrape: "
        f"{'met' if p95 <= TARGET_MS else 'NOT met'} (p95)."
    )


def peer_check_cost(rounds: int = 200) -> tuple[float, float, int]:
    """(netlink lookup, /proc table lookup) median CPU microseconds, and the sockets in the
    IPv4 table, for one loopback connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    ends = (conn.getpeername(), conn.getsockname())
    out = []
    for fn in (diag_uid, peer_uid):
        assert fn(*ends) == os.geteuid()
        cpu = []
        for _ in range(rounds):
            t0 = time.process_time()
            fn(*ends)
            cpu.append((time.process_time() - t0) * 1e6)
        out.append(statistics.median(cpu))
    for s in (conn, client, listener):
        s.close()
    with open("/proc/net/tcp", "rb") as fh:
        sockets = len(fh.read().splitlines()) - 1
    return out[0], out[1], sockets


if __name__ == "__main__":
    main()
