"""Exporter cost per scrape: 8 jobs x 8 GPUs on one node.

Eight real live summaries are written by real samplers (``capture.sampler.Sampler`` fed by a
fixed fake source, as a node's samplers write them), then one scrape is what the exporter
does for ``GET /metrics``: list the live directory, read and clean every summary, render the
exposition. Measured in process CPU time (``time.process_time``) over many scrapes, after a
warm-up. Then the whole exporter: the real HTTP server in a child process (the local peer
check on, the caller allowed, as deployed), scraped over loopback; its CPU per scrape is the
child's process CPU time (every thread: accept, peer check, request, exposition, answer)
over the scrapes, divided by their number. Also the same exposition through
``prometheus_client``'s generator, for comparison. Target: <= 1.5 ms CPU per scrape, for
both the exposition and the whole server. Prints a Markdown section for docs/performance.md.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

from slurm_gpu.capture.sampler import Sampler, SamplerOptions
from slurm_gpu.live.exporter import ExporterOptions, exposition, make_server
from slurm_gpu.live.exposition import GPU_METRICS, JOB_METRICS
from slurm_gpu.live.peeruid import diag_uid, peer_uid
from slurm_gpu.live.snapshot import read_node
from slurm_gpu.records import GpuInfo, GpuSample, HostSample, NodeSnapshot

JOBS = 8
GPUS = 8
READINGS = 40
TARGET_MS = 1.5
#: Longest wait for the exporter child to answer, in seconds.
WAIT_S = 60.0


class _Source:
    name = "bench"

    def __init__(self, uuids: Sequence[str], clock: list[float]) -> None:
        self.uuids, self.clock = uuids, clock

    def list_gpus(self) -> Sequence[GpuInfo]:
        return [
            GpuInfo(uuid=u, minor_number=i, memory_total_bytes=80 << 30)
            for i, u in enumerate(self.uuids)
        ]

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

    def job_gone(self) -> bool:
        return False


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
            opts,
            lambda u=uuids, c=clock: _Source(u, c),  # type: ignore[misc]
            _Host(),
            clock=lambda c=clock: c[0],  # type: ignore[misc]
        )
        sampler.open_spool()
        for _ in range(READINGS):
            sampler.read_once()
            clock[0] += 10.0
        sampler.write_live()


def _serve(spool: str, conn: Connection) -> None:
    """The child: the real exporter on loopback, its port sent back, then its process CPU
    seconds at each request of the parent."""
    gated = ExporterOptions(spool, 3600.0, frozenset({0, os.geteuid()}))
    srv = make_server(gated, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    conn.send(srv.server_address[1])
    while conn.recv() == "cpu":
        conn.send(time.process_time())
    srv.shutdown()


def _scrape(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"scrape answered {resp.status}")
    return body


def server_cost(spool: str, scrapes: int) -> tuple[float, float, int]:
    """(server CPU per scrape in ms, client wall per scrape in ms median, bytes) of the real
    exporter in a child process, over ``scrapes`` sequential scrapes after a warm-up."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(spool, child), daemon=True)
    proc.start()

    def answer() -> Any:
        # Bounded: a child that died or hangs fails the benchmark instead of hanging it.
        if not parent.poll(WAIT_S):
            proc.kill()
            raise RuntimeError(f"the exporter child did not answer within {WAIT_S:g} s")
        return parent.recv()

    port = answer()
    for _ in range(20):
        _scrape(port)
    parent.send("cpu")
    cpu0 = answer()
    walls = []
    for _ in range(scrapes):
        t0 = time.perf_counter()
        body = _scrape(port)
        walls.append((time.perf_counter() - t0) * 1e3)
    parent.send("cpu")
    cpu1 = answer()
    parent.send("stop")
    proc.join(10)
    if proc.is_alive():
        proc.kill()
    return (cpu1 - cpu0) * 1e3 / scrapes, statistics.median(walls), len(body)


def _families(snap: NodeSnapshot) -> Iterator[Any]:
    """The snapshot as ``prometheus_client`` metric families (the same series)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    names = ["job_id", "user", "account", "partition", "host"]
    for metric in JOB_METRICS + GPU_METRICS:
        counter = metric.type == "counter"
        cls = CounterMetricFamily if counter else GaugeMetricFamily
        gpu = metric in GPU_METRICS
        fam = cls(
            metric.name.removesuffix("_total") if counter else metric.name,
            metric.help,
            labels=[*names, "gpu_uuid", "gpu_index"] if gpu else names,
        )
        for j in snap.jobs:
            job = [j.job_id, j.user, j.account, j.partition, j.host]
            gpus = ((g, [*job, g.uuid, str(g.gpu_index)]) for g in j.gpus)
            for obj, values in gpus if gpu else [(j, job)]:
                v = metric.value(obj)
                if v is not None:
                    fam.add_metric(values, v)
        yield fam


def client_library_cost(spool: str, now: float, rounds: int) -> float:
    """Median CPU ms of ``prometheus_client.generate_latest`` over the same series (the
    snapshot read once: the generator alone)."""
    from prometheus_client import CollectorRegistry, generate_latest

    snap = read_node(spool, now, 3600.0)

    class _Collector:
        def collect(self) -> Iterator[Any]:
            return _families(snap)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    for _ in range(10):
        generate_latest(registry)
    cpu = []
    for _ in range(rounds):
        t0 = time.process_time()
        generate_latest(registry)
        cpu.append((time.process_time() - t0) * 1e3)
    return statistics.median(cpu)


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
        render_ms = _render_cost(spool, now, args.scrapes)
        server_ms, wall_ms, size = server_cost(spool, args.scrapes)
        library_ms = client_library_cost(spool, now, 100)
    diag_us, table_us, sockets = peer_check_cost()
    local_us = local_check_cost()
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
    print(f"| exposition (read + render), CPU per scrape, median | {median:.2f} ms |")
    print(f"| exposition, CPU per scrape, p95 | {p95:.2f} ms |")
    print(f"| of which rendering the text, median | {render_ms:.2f} ms |")
    print(
        f"| the same text from `prometheus_client.generate_latest`, median | {library_ms:.2f} ms |"
    )
    print(f"| whole exporter process, CPU per HTTP scrape, mean | {server_ms:.2f} ms |")
    print(f"| wall per HTTP scrape on loopback, median (client included) | {wall_ms:.2f} ms |")
    print(f"| exposition size | {size / 1024:.1f} KiB |")
    if local_us is not None:
        print(f"| is the peer address this host's (route lookup), median CPU | {local_us:.0f} us |")
    print(f"| local client's uid, netlink sock_diag lookup, median CPU | {diag_us:.0f} us |")
    print(
        f"| the same from /proc/net/tcp ({sockets} sockets on the host), median CPU | "
        f"{table_us:.0f} us |"
    )
    print(f"| series in all | {series} |")
    print(f"| series per GPU (GPU families) | {gpu_series / (JOBS * GPUS):.1f} |")
    print(f"| series per job and host (job families) | {(series - gpu_series - 3) / JOBS:.1f} |")
    met = p95 <= TARGET_MS and server_ms <= TARGET_MS
    print(
        f"\nTarget <= {TARGET_MS:g} ms CPU per scrape (exposition p95 and whole process): "
        f"{'met' if met else 'NOT met'}."
    )
    from results import target_line

    print(
        target_line(
            f"exporter, CPU per scrape ({JOBS} jobs x {GPUS} GPUs): exposition p95, whole process",
            f"{p95:.2f} ms, {server_ms:.2f} ms",
            f"≤ {TARGET_MS:g} ms",
            met,
            peer=f"`prometheus_client.generate_latest` {library_ms:.2f} ms (same text)",
        )
    )


def _render_cost(spool: str, now: float, rounds: int) -> float:
    """Median CPU ms of rendering the text alone (the snapshot read once)."""
    from slurm_gpu.live.exposition import render

    snap = read_node(spool, now, 3600.0)
    cpu = []
    for _ in range(rounds):
        t0 = time.process_time()
        render(snap)
        cpu.append((time.process_time() - t0) * 1e3)
    return statistics.median(cpu)


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


def local_check_cost(rounds: int = 200) -> float | None:
    """Median CPU microseconds of telling whether a peer address is this host's own (the
    route lookup, ``live.localaddr``); ``None`` where the module is absent (an older tree,
    for a before)."""
    try:
        from slurm_gpu.live.localaddr import is_local_address
    except ImportError:
        return None
    cpu = []
    for _ in range(rounds):
        t0 = time.process_time()
        is_local_address("192.0.2.77")
        cpu.append((time.process_time() - t0) * 1e6)
    return statistics.median(cpu)


if __name__ == "__main__":
    main()
