"""Record, on a machine with a real NVIDIA GPU, what NVML returns and costs and real job traces.

Two parts, everything written under ``--out`` (``device.json`` and one sealed record per job):

1. **NVML calls.** ``NvmlSource`` (the sampler's own source) reads the GPU ``--readings``
   times while the GPU is idle, then as often while a PyTorch process keeps it busy. Every C
   entry point pynvml calls is timed (``time.perf_counter_ns`` around the ctypes call) and its
   return codes counted; the readings themselves are kept (the first and last of each phase).
   This measures what ``benchmarks/bench_nvml_calls.py`` can only model without a GPU.
2. **Jobs.** For each pattern of ``benchmarks/device_workloads.py``: the real prolog
   (``python -m slurm_gpu.hooks prolog`` with a Slurm-like environment, as slurmd runs it)
   starts the real sampler on the GPU (``telemetry.backend = "nvml"``,
   ``telemetry.interval_s``), the workload runs as the "job" (under a stand-in slurmstepd, a
   shell named ``slurmstepd`` titled ``slurmstepd: [<job>.0]``, where the sampler's /proc
   method finds it), the real epilog seals the record.
   The sampler's CPU time is read from ``/proc/<pid>/stat`` at two points of the job.

There is no Slurm on the GPU machine: the job's accounting record is composed afterwards from
what this script ran (``benchmarks/device_traces.py``), and says so.

Needs root (the hooks run as root) and slurm_gpu importable by ``python -I`` (the hooks start
the sampler with it): ``--install`` writes a ``.pth`` file into the interpreter's site-packages
pointing at this checkout. ``--backend virtual`` tries the whole script on a machine without a
GPU (virtual GPUs, the fake NVML library for part 1, workloads with ``--dry``).

Usage on the GPU machine, from the repository root::

    python3 benchmarks/device_record.py --install --out "$OUT/rec"
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import site
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the checkout is not on the path otherwise
WORKLOADS = ROOT / "benchmarks" / "device_workloads.py"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def install_pth() -> str:
    """Make this checkout importable under ``python -I`` (a throwaway machine only)."""
    target = Path(site.getsitepackages()[0]) / "slurm_gpu_checkout.pth"
    target.write_text(f"{ROOT}\n")
    return str(target)


# --- part 1: NVML calls ------------------------------------------------------------------------


class _Timed:
    """A pynvml C function that times each call and counts its return codes."""

    def __init__(self, name: str, fn: Any, book: dict[str, Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_book", book)

    def __call__(self, *args: Any) -> Any:
        t0 = time.perf_counter_ns()
        ret = self._fn(*args)
        dt = time.perf_counter_ns() - t0
        entry = self._book[self._name]
        entry["ns"].append(dt)
        entry["codes"][ret if isinstance(ret, int) else "value"] += 1
        return ret

    def __getattr__(self, key: str) -> Any:
        return getattr(self._fn, key)

    def __setattr__(self, key: str, value: Any) -> None:  # restype/argtypes go to ctypes
        setattr(self._fn, key, value)


def _instrument(pynvml: Any) -> dict[str, Any]:
    book: dict[str, Any] = defaultdict(lambda: {"ns": [], "codes": Counter()})
    original = pynvml._nvmlGetFunctionPointer
    cache: dict[str, _Timed] = {}

    def lookup(name: str) -> Any:
        if name not in cache:
            cache[name] = _Timed(name, original(name), book)
        return cache[name]

    pynvml._nvmlGetFunctionPointer = lookup
    return book


def _summary(book: dict[str, Any], readings: int) -> dict[str, Any]:
    out = {}
    for name, entry in sorted(book.items()):
        ns = sorted(entry["ns"])
        out[name] = {
            "calls": len(ns),
            "calls_per_reading": round(len(ns) / readings, 3) if readings else None,
            "median_us": round(statistics.median(ns) / 1000, 2),
            "p95_us": round(ns[min(len(ns) - 1, int(0.95 * len(ns)))] / 1000, 2),
            "max_us": round(ns[-1] / 1000, 2),
            "total_us": round(sum(ns) / 1000, 1),
            "return_codes": {str(k): v for k, v in entry["codes"].items()},
        }
    return out


def _jsonable(sample: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(sample), default=str))


def nvml_calls(readings: int, spacing_s: float, backend: str) -> dict[str, Any]:
    import pynvml

    if backend == "virtual":  # the fake library of the tests, for a dry run
        sys.path.insert(0, str(ROOT / "tests"))
        from nvmlfake.driver import FakeDriver

        FakeDriver("r570_h100").install(pynvml)
    book = _instrument(pynvml)
    from slurm_gpu.config import TelemetrySettings
    from slurm_gpu.telemetry import counters_every
    from slurm_gpu.telemetry.nvml import NvmlSource

    every = counters_every(TelemetrySettings())  # the sampler's default cadence
    src = NvmlSource(counters_every=every)
    t0 = time.perf_counter()
    gpus = list(src.list_gpus())
    list_s = time.perf_counter() - t0
    uuids = [gpus[0].uuid]
    result: dict[str, Any] = {
        "gpus": [_jsonable(g) for g in gpus],
        "list_gpus_s": round(list_s, 4),
        "setup_calls": _summary(book, 0),
        "counters_every": every,
        "phases": {},
    }
    book.clear()
    first = src.sample(uuids)  # the first reading sets up events and GPM
    result["first_reading"] = [_jsonable(s) for s in first]
    result["first_reading_calls"] = _summary(book, 1)
    load = None
    # (phase, counters read at one reading in this many): the default cadence idle and busy,
    # then every reading (as before the counters had their own cadence) for the comparison.
    for phase, cadence in (("idle", every), ("busy", every), ("busy-counters-every-reading", 1)):
        if phase == "busy":
            argv = [sys.executable, str(WORKLOADS), "healthy", "--seconds", "600"]
            load = subprocess.Popen(
                argv + (["--dry"] if backend == "virtual" else []), stdout=subprocess.DEVNULL
            )
            time.sleep(8.0)  # CUDA start-up; then the GPU is busy
        src.counters_every = cadence
        book.clear()
        kept = []
        wall: dict[str, list[float]] = {"plain": [], "counters": []}
        cpu0 = time.process_time()
        for i in range(readings):
            t = time.perf_counter()
            samples = src.sample(uuids)
            dt = time.perf_counter() - t
            # A reading that read the counters carries the energy total; the others do not.
            kind = "counters" if samples and samples[0].energy_mj is not None else "plain"
            wall[kind].append(dt)
            if i in (0, readings - 1):
                kept.append([_jsonable(s) for s in samples])
            time.sleep(spacing_s)
        cpu = time.process_time() - cpu0
        result["phases"][phase] = {
            "readings": readings,
            "spacing_s": spacing_s,
            "counters_every": cadence,
            "wall_per_reading_ms": {
                kind: {
                    "n": len(ws),
                    "median": round(statistics.median(ws) * 1000, 3),
                    "max": round(max(ws) * 1000, 3),
                }
                for kind, ws in wall.items()
                if ws
            },
            "wall_mean_ms": round(sum(sum(w) for w in wall.values()) / readings * 1000, 3),
            "cpu_per_reading_ms": round(cpu / readings * 1000, 3),
            "calls": _summary(book, readings),
            "samples_first_last": kept,
        }
    if load is not None:
        load.kill()
        load.wait()
    t = time.perf_counter()
    src.read_counters(uuids)  # what the seal adds
    result["seal_read_counters_ms"] = round((time.perf_counter() - t) * 1000, 3)
    src.close()
    return result


# --- part 2: jobs ------------------------------------------------------------------------------


def _config(base: Path, backend: str, interval_s: float) -> Path:
    cfg = base / "slurm-gpu.toml"
    telemetry = f'[telemetry]\nbackend = "{backend}"\ninterval_s = {interval_s}\n'
    if backend == "virtual":
        from slurm_gpu.telemetry.virtual_device import create_gpus

        create_gpus(base / "vgpu", 1)
        telemetry += f'virtual_dir = "{base}/vgpu"\n'
    cfg.write_text(
        f'[paths]\nspool_dir = "{base}/spool"\nstate_dir = "{base}/state"\n'
        f'log_file = "{base}/hooks.log"\n'
        + telemetry
        + "checkpoint_interval_s = 5\n[hooks]\nsampler_stop_timeout_s = 5\n"
    )
    return cfg


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)


def _cpu_ns(pid: int) -> int | None:
    """Time on a CPU, ns (``/proc/<pid>/schedstat``: finer than the tick counts of ``stat``)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


#: Workloads that never end by themselves: ended as Slurm ends a job at its time limit.
AT_LIMIT = {"killed-at-limit"}
#: Slurm's KillWait here (its default is 30 s): SIGTERM, then SIGKILL this many s later.
KILL_WAIT_S = 5.0


def _hook(cfg: Path, hook: str, env: dict[str, str]) -> float:
    full = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_GPU_CONFIG": str(cfg), **env}
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-I", "-m", "slurm_gpu.hooks", hook], env=full, cwd="/", timeout=60
    )
    return time.monotonic() - t0


def run_job(
    base: Path,
    cfg: Path,
    job_id: str,
    pattern: str,
    uuid: str,
    seconds: float,
    cores: int,
    dry: bool,
) -> dict[str, Any]:
    from slurm_gpu.capture.spoolpaths import JobSpool, read_pidfile
    from slurm_gpu.hooks.common import short_hostname

    slurm = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_UID": str(os.getuid()),
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_GPUS": "0",
        "CUDA_VISIBLE_DEVICES": uuid,
        "SLURM_CPUS_ON_NODE": str(cores),
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_ACCOUNT": "device",
    }
    spool = JobSpool(f"{base}/spool", job_id, short_hostname())
    start = time.time()
    prolog_s = _hook(cfg, "prolog", slurm)
    found = read_pidfile(spool.pid)
    sampler = found[0] if found else None
    env = {
        **os.environ,
        **{k: v for k, v in slurm.items() if k != "CUDA_VISIBLE_DEVICES"},
        "CUDA_VISIBLE_DEVICES": "0",
        "OMP_NUM_THREADS": str(cores),
    }
    # The job's cores, as Slurm's task affinity would bind them (where taskset is there).
    pin = ["taskset", "-c", f"0-{cores - 1}"] if shutil.which("taskset") else []
    name, _, extra = pattern.partition("@")  # "dataloader@--transform-ms=5"
    argv = [*pin, sys.executable, str(WORKLOADS), name, *extra.split()]
    argv += ["--seconds", str(seconds)] + (["--dry"] if dry else [])
    # The /proc method counts only processes under the job's own slurmstepd (never by
    # SLURM_JOB_ID): the workload runs under a root shell with slurmstepd's name and title.
    stepd = base / "slurmstepd"
    if not stepd.exists():
        shutil.copy("/bin/sh", stepd)
    argv = [f"slurmstepd: [{job_id}.0]", "-c", '"$@"; exit $?', "slurmstepd", *argv]
    at_limit = name in AT_LIMIT
    if at_limit:
        argv += ["--seconds", str(seconds * 10)]  # its own bound, far past the limit
    work_start = time.time()
    proc = subprocess.Popen(
        argv,
        executable=str(stepd),
        env=env,
        stdout=subprocess.PIPE,
        cwd=str(base),
        start_new_session=True,  # a process group, as a step's tasks are signalled together
    )
    time.sleep(min(10.0, seconds / 4))
    cpu_mark = (time.time(), _cpu_ticks(sampler), _cpu_ns(sampler)) if sampler else None
    limit: dict[str, Any] | None = None
    if at_limit:
        # Slurm at the time limit: SIGTERM to every task of the step, SIGKILL after KillWait.
        try:
            out, _ = proc.communicate(timeout=max(0.0, work_start + seconds - time.time()))
        except subprocess.TimeoutExpired:
            limit = {"time_limit_s": seconds, "kill_wait_s": KILL_WAIT_S}
            limit["sigterm_s"] = time.time()
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=KILL_WAIT_S)
                limit["sigkill"] = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate(timeout=30)
                limit["sigkill"] = True
    else:
        out, _ = proc.communicate(timeout=seconds + 120)
    work_end = time.time()
    cpu_end = (time.time(), _cpu_ticks(sampler), _cpu_ns(sampler)) if sampler else None
    epilog_s = _hook(cfg, "epilog", {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(os.getuid())})
    end = time.time()
    kept = None
    if os.path.exists(spool.record):
        kept = f"{job_id}-{name}.record"
        shutil.copy(spool.record, base / "out" / kept)
    try:
        report = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        report = {"raw": out.decode(errors="replace")[-2000:]}
    return {
        "pinned": bool(pin),
        "job_id": job_id,
        "pattern": name,
        "workload_args": extra,
        "cores": cores,
        "seconds": seconds,
        "start_s": start,
        "work_start_s": work_start,
        "work_end_s": work_end,
        "end_s": end,
        "exit_code": proc.returncode,
        "prolog_s": round(prolog_s, 3),
        "epilog_s": round(epilog_s, 3),
        "sampler_pid": sampler,
        "sampler_cpu": {
            "mark": cpu_mark,
            "end": cpu_end,
            "clk_tck": CLK_TCK,
        },
        "record": kept,
        "time_limit": limit,
        "workload": report,
        "workload_lines": out.decode(errors="replace").strip().splitlines()[-20:],
    }


def gpu_facts(backend: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"host": platform.node(), "kernel": platform.release()}
    try:
        facts["nvidia_smi"] = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,uuid,driver_version,memory.total,pci.bus_id,compute_cap,"
                "power.limit,mig.mode.current,persistence_mode",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        facts["nvidia_smi"] = f"unavailable: {exc}"
    try:
        from importlib.metadata import version

        facts["nvidia_ml_py"] = version("nvidia-ml-py")
    except ImportError:
        facts["nvidia_ml_py"] = None
    except Exception as exc:  # PackageNotFoundError: pynvml from elsewhere
        facts["nvidia_ml_py"] = f"unknown ({type(exc).__name__})"
    if backend == "nvml":
        try:
            import torch

            facts["torch"] = torch.__version__
            facts["cuda"] = torch.version.cuda
        except ImportError:
            facts["torch"] = None
    facts["python"] = platform.python_version()
    facts["cpus"] = os.cpu_count()
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", choices=("nvml", "virtual"), default="nvml")
    parser.add_argument("--install", action="store_true", help="write the .pth file first")
    parser.add_argument("--readings", type=int, default=40)
    parser.add_argument("--spacing", type=float, default=0.25, help="between readings, s")
    parser.add_argument("--seconds", type=float, default=40.0, help="each job's length, s")
    parser.add_argument("--interval", type=float, default=1.0, help="sampler interval, s")
    parser.add_argument("--cores", type=int, default=4)
    parser.add_argument(
        "--patterns",
        default="host-bound,ranks-one-gpu,killed-at-limit",
        help="comma-separated workloads, each NAME or NAME@ARGS (ARGS to device_workloads.py)",
    )
    args = parser.parse_args()
    base = Path(args.out).resolve()
    (base / "out").mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "args": vars(args)}
    if args.install:
        result["pth"] = install_pth()
    result["facts"] = gpu_facts(args.backend)
    print(json.dumps(result["facts"]), flush=True)
    dump = base / "out" / "device.json"

    def save() -> None:
        dump.write_text(json.dumps(result, indent=1, default=str))

    try:
        if args.readings > 0:
            result["nvml"] = nvml_calls(args.readings, args.spacing, args.backend)
    except Exception as exc:  # keep going: the jobs are worth recording on their own
        result["nvml_error"] = f"{type(exc).__name__}: {exc}"
    save()
    print("nvml part done", result.get("nvml_error", ""), flush=True)
    cfg = _config(base, args.backend, args.interval)
    uuid = _first_uuid(args.backend, base)
    result["jobs"] = []
    for n, pattern in enumerate(args.patterns.split(",")):
        try:
            job = run_job(
                base, cfg, str(9001 + n), pattern, uuid, args.seconds, args.cores,
                args.backend == "virtual",
            )  # fmt: skip
        except Exception as exc:
            job = {"pattern": pattern, "error": f"{type(exc).__name__}: {exc}"}
        result["jobs"].append(job)
        save()
        print(json.dumps({k: job.get(k) for k in ("pattern", "exit_code", "record", "error")}),
              flush=True)  # fmt: skip
    log = base / "hooks.log"
    if log.exists():
        shutil.copy(log, base / "out" / "hooks.log")
    save()


def _first_uuid(backend: str, base: Path) -> str:
    if backend == "virtual":
        from slurm_gpu.telemetry.virtual import VirtualGpuSource

        return VirtualGpuSource(str(base / "vgpu")).list_gpus()[0].uuid
    import pynvml

    pynvml.nvmlInit()
    try:
        raw = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    return raw.decode() if isinstance(raw, bytes) else str(raw)


if __name__ == "__main__":
    main()
