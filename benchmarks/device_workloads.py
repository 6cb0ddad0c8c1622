"""Short real PyTorch jobs, one per pattern, for recording traces on a machine with a GPU.

Run by ``benchmarks/device_record.py`` as the "job" between the real prolog and epilog; each
prints one JSON line with what it did (steps, step rate, phases in seconds). Without PyTorch
or without a GPU (``--dry``) each pattern keeps its shape on the CPU, so the recording script
can be tried end to end on a machine with virtual GPUs.

Patterns (``--seconds`` is the job's length, s):

``small-batch``
    A small MLP trained with 4 samples per step: kernels are tiny, the GPU is "busy" in short
    bursts with most of its multiprocessors idle.
``dataloader``
    A convolution net fed by a ``DataLoader`` with ``num_workers=0`` whose per-sample transform
    costs ~20 ms of one CPU core: the GPU waits for the main process.
``two-procs-one-idle``
    Two processes on the job's GPU: rank 0 trains, rank 1 holds a CUDA context and memory and
    waits the whole job (a rank stuck at a barrier, a helper that never works).
``cpu-tail``
    Training on the GPU for the first 40 % of the job, then CPU-only post-processing (one core)
    with the CUDA context still held for the rest.
``healthy``
    Large bf16 matrix products for the whole job: the GPU busy and its tensor cores used.
``host-bound``
    A ``DataLoader`` with one worker per core of the job (``--workers``, default the cores it
    may run on) whose per-batch CPU work is sized, from the GPU step timed at start, so that
    the workers feed the GPU at ``--duty`` of its rate (0.6): every core busy, the GPU at a
    moderate duty cycle (a host-bound pipeline, not a starved one).
``ranks-one-gpu``
    ``--ranks`` processes (4) started as ``srun -n 4`` would, all on the job's one GPU, each
    training its own MLP with a loss read every step: the GPU time-sliced between the ranks.
``killed-at-limit``
    Training (bf16 transformer-sized matrix products, a loss read every step) that never ends
    by itself: the recording script ends it as Slurm does at the time limit, SIGTERM mid-step
    then SIGKILL after the kill wait. It prints a progress line every 5 s and, on SIGTERM, the
    step it was in.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

PATTERNS = (
    "small-batch",
    "dataloader",
    "two-procs-one-idle",
    "cpu-tail",
    "healthy",
    "host-bound",
    "ranks-one-gpu",
    "killed-at-limit",
)

#: Samples per step of ``small-batch`` (``--batch``).
BATCH = 4
#: CPU seconds of ``dataloader``'s transform per sample (``--transform-ms``).
TRANSFORM_S = 0.02
#: ``host-bound``: loader workers (0: one per core of the job) and the duty they feed.
WORKERS = 0
DUTY = 0.6
#: ``ranks-one-gpu``: ranks on the one GPU.
RANKS = 4


def _torch(dry: bool) -> Any:
    if dry:
        return None
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible; pass --dry to try the shapes on the CPU")
    return torch


def _cpu_work(seconds: float) -> int:
    """Busy one core for ``seconds`` (numpy when there, else pure Python); returns rounds."""
    deadline = time.monotonic() + seconds
    rounds = 0
    try:
        import numpy as np

        a = np.random.default_rng(0).random((256, 256))
        while time.monotonic() < deadline:
            a = np.abs(np.fft.ifft2(np.fft.fft2(a))).astype(np.float64)
            rounds += 1
    except ImportError:
        while time.monotonic() < deadline:
            sum(i * i for i in range(20_000))
            rounds += 1
    return rounds


def small_batch(seconds: float, dry: bool) -> dict[str, Any]:
    torch = _torch(dry)
    if torch is None:
        time.sleep(seconds)
        return {"steps": 0}
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, 256, device=dev)
    y = torch.randint(0, 10, (BATCH,), device=dev)
    steps = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if steps % 200 == 0:
            torch.cuda.synchronize()  # keep the queue short, as a loss.item() would
    torch.cuda.synchronize()
    return {"steps": steps, "batch": BATCH, "steps_per_s": round(steps / seconds, 1)}


class _SlowDataset:
    """Images made and transformed on the CPU at ~20 ms each (the transform is the cost)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import numpy as np

        rng = np.random.default_rng(i)
        img = rng.random((3, 64, 64), dtype=np.float32)
        t_end = time.perf_counter() + TRANSFORM_S
        while time.perf_counter() < t_end:  # an augmentation pipeline's cost, on one core
            img = np.clip(img * 1.0001 + rng.normal(0, 0.001, img.shape).astype(np.float32), 0, 1)
        return img, int(i % 10)


def dataloader(seconds: float, dry: bool) -> dict[str, Any]:
    torch = _torch(dry)
    ds = _SlowDataset(100_000)
    if torch is None:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            ds[n]
            n += 1
        return {"samples": n}
    from torch.utils.data import DataLoader

    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=0)
    steps = 0
    deadline = time.monotonic() + seconds
    for x, y in loader:
        x, y = x.to(dev, non_blocking=True), y.to(dev)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if time.monotonic() >= deadline:
            break
    torch.cuda.synchronize()
    return {
        "transform_ms": TRANSFORM_S * 1000,
        "steps": steps,
        "batch": 32,
        "num_workers": 0,
        "steps_per_s": round(steps / seconds, 2),
    }


def _busy_gpu(torch: Any, seconds: float, n: int = 4096) -> int:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    steps = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(20):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()
        steps += 20
    return steps


def _run_ranks(n: int, kind: str, seconds: float, dry: bool) -> dict[str, Any]:
    """Start ``n`` ranks of ``kind`` (``--rank-kind``) as srun would, wait, gather reports."""
    procs = []
    for r in range(n):
        argv = [sys.executable, __file__, "--rank", str(r), "--seconds", str(seconds),
                "--rank-kind", kind]  # fmt: skip
        procs.append(subprocess.Popen(argv + (["--dry"] if dry else []), stdout=subprocess.PIPE))
    out = [json.loads(p.communicate()[0] or b"{}") for p in procs]
    return {"ranks": out, "exit_codes": [p.returncode for p in procs]}


def two_procs_one_idle(seconds: float, dry: bool) -> dict[str, Any]:
    """Rank 0 trains, rank 1 holds a context and waits."""
    return _run_ranks(2, "hold", seconds, dry)


def rank(rank_id: int, seconds: float, dry: bool) -> dict[str, Any]:
    torch = _torch(dry)
    if torch is None:
        if rank_id == 0:
            return {"rank": 0, "rounds": _cpu_work(seconds)}
        time.sleep(seconds)
        return {"rank": 1, "waited_s": seconds}
    if rank_id == 0:
        return {"rank": 0, "steps": _busy_gpu(torch, seconds)}
    held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # context + 256 MiB
    torch.cuda.synchronize()
    time.sleep(seconds)
    return {"rank": 1, "held_bytes": held.numel(), "waited_s": seconds}


def cpu_tail(seconds: float, dry: bool) -> dict[str, Any]:
    torch = _torch(dry)
    gpu_s = 0.4 * seconds
    steps = _busy_gpu(torch, gpu_s) if torch is not None else _cpu_work(gpu_s)
    rounds = _cpu_work(seconds - gpu_s)  # post-processing on one core; the context stays
    return {
        "gpu_phase_s": gpu_s,
        "cpu_phase_s": seconds - gpu_s,
        "steps": steps,
        "cpu_rounds": rounds,
    }


def _host_cores() -> int:
    """The cores this process may run on (its affinity: what ``taskset`` or Slurm gave it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _HostBatches:
    """Batches whose making costs ``cost_s`` of one core each (an input pipeline's decode and
    augmentation), numbered so a worker makes each once."""

    def __init__(self, n: int, cost_s: float, shape: tuple[int, ...]) -> None:
        self.n, self.cost_s, self.shape = n, cost_s, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import numpy as np

        rng = np.random.default_rng(i)
        x = rng.random(self.shape, dtype=np.float32)
        t_end = time.perf_counter() + self.cost_s
        while time.perf_counter() < t_end:
            x = np.tanh(x * 1.0001 + 0.001)
        return x


def _gpu_step(torch: Any, x: Any, w: Any, reps: int) -> Any:
    """One step's GPU work: ``reps`` bf16 products of ``x`` with ``w``, then the loss read
    back (a sync, as logging it does)."""
    y = x
    for _ in range(reps):
        y = torch.tanh(y @ w)
    return float(y.float().mean().item())


def host_bound(seconds: float, dry: bool) -> dict[str, Any]:
    torch = _torch(dry)
    workers = WORKERS or _host_cores()
    shape = (512, 4096)  # 8 MiB of float32 a batch
    if torch is None:
        return {"rounds": _cpu_work(seconds), "workers": workers}
    from torch.utils.data import DataLoader

    dev = torch.device("cuda")
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) / 64
    h = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16)
    reps = 120  # ~45 ms on an H100 or H200: a batch every ~0.3 s per worker

    def step(batch: Any) -> float:
        h[:512] = batch.to(dev, non_blocking=True).to(torch.bfloat16)
        return _gpu_step(torch, h, w, reps)

    probe = torch.randn(*shape)
    for _ in range(3):
        step(probe)  # warm-up: kernels chosen, clocks up
    t0 = time.perf_counter()
    for _ in range(10):
        step(probe)
    step_s = (time.perf_counter() - t0) / 10
    # ``workers`` batches are made at once, each in cost_s: the GPU is fed at workers/cost_s
    # batches a second and busy step_s of each, so its duty is step_s * workers / cost_s.
    cost_s = step_s * workers / DUTY
    loader = DataLoader(
        _HostBatches(1_000_000, cost_s, shape),
        batch_size=None,
        num_workers=workers,
        pin_memory=True,
        prefetch_factor=2,
    )
    steps = 0
    deadline = time.monotonic() + seconds
    for batch in loader:
        step(batch)
        steps += 1
        if time.monotonic() >= deadline:
            break
    return {
        "workers": workers,
        "gpu_step_s": round(step_s, 4),
        "batch_cpu_s": round(cost_s, 4),
        "duty_planned": DUTY,
        "steps": steps,
        "steps_per_s": round(steps / seconds, 2),
        "duty_from_steps": round(steps * step_s / seconds, 3),
    }


def ranks_one_gpu(seconds: float, dry: bool) -> dict[str, Any]:
    """``RANKS`` training ranks (as ``srun -n`` would start them), every one on device 0."""
    return _run_ranks(RANKS, "train", seconds, dry)


def train_rank(rank_id: int, seconds: float, dry: bool) -> dict[str, Any]:
    """One rank of ``ranks-one-gpu``: an MLP (2048 wide, batch 512) trained on device 0."""
    torch = _torch(dry)
    if torch is None:
        return {"rank": rank_id, "rounds": _cpu_work(seconds)}
    dev = torch.device("cuda:0")
    torch.manual_seed(rank_id)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 2048), torch.nn.GELU(),
        torch.nn.Linear(2048, 2048), torch.nn.GELU(),
        torch.nn.Linear(2048, 10),
    ).to(dev)  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048, device=dev)
    y = torch.randint(0, 10, (512,), device=dev)
    steps = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        float(loss.item())  # logged every step, as most loops do: a sync per step
        steps += 1
    return {"rank": rank_id, "steps": steps, "steps_per_s": round(steps / seconds, 1)}


def killed_at_limit(seconds: float, dry: bool) -> dict[str, Any]:
    """Train until killed; ``seconds`` only bounds a run nobody ends (``--dry`` ends there)."""
    torch = _torch(dry)
    state = {"step": 0, "in_step": False, "t0": time.time()}

    def on_term(signum: int, frame: Any) -> None:
        # What a job's log shows at its time limit: the step it was in, then nothing.
        print(json.dumps({"signal": "SIGTERM", "step": state["step"],
                          "in_step": state["in_step"],
                          "after_s": round(time.time() - state["t0"], 2)}), flush=True)  # fmt: skip
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    if torch is None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            _cpu_work(0.1)
            state["step"] += 1
        return {"steps": state["step"]}
    dev = torch.device("cuda")
    w = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) / 90
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    last = time.monotonic()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state["in_step"] = True
        _gpu_step(torch, x, w, 60)  # ~0.1 s of products, then the loss read back
        state["in_step"] = False
        state["step"] += 1
        if time.monotonic() - last >= 5.0:
            last = time.monotonic()
            print(json.dumps({"progress": True, "step": state["step"]}), flush=True)
    return {"steps": state["step"], "ended": "by its own bound, not killed"}


def healthy(seconds: float, dry: bool) -> dict[str, Any]:
    torch = _torch(dry)
    if torch is None:
        return {"rounds": _cpu_work(seconds)}
    return {"steps": _busy_gpu(torch, seconds, n=8192)}


def main() -> None:
    global BATCH, TRANSFORM_S, WORKERS, DUTY, RANKS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", nargs="?", choices=PATTERNS)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dry", action="store_true", help="no GPU: keep the shapes on the CPU")
    parser.add_argument("--batch", type=int, default=BATCH, help="small-batch: samples a step")
    parser.add_argument(
        "--transform-ms", type=float, default=TRANSFORM_S * 1000, help="dataloader: per sample"
    )
    parser.add_argument("--workers", type=int, default=0, help="host-bound: 0 = one per core")
    parser.add_argument("--duty", type=float, default=DUTY, help="host-bound: planned duty")
    parser.add_argument("--ranks", type=int, default=RANKS, help="ranks-one-gpu: ranks")
    parser.add_argument("--rank-kind", default="hold", help=argparse.SUPPRESS)
    args = parser.parse_args()
    BATCH, TRANSFORM_S = args.batch, args.transform_ms / 1000.0
    WORKERS, DUTY, RANKS = args.workers, args.duty, args.ranks
    t0 = time.time()
    if args.rank is not None and args.rank_kind == "train":
        result = train_rank(args.rank, args.seconds, args.dry)
    elif args.rank is not None:
        result = rank(args.rank, args.seconds, args.dry)
    else:
        fn = {
            "small-batch": small_batch,
            "dataloader": dataloader,
            "two-procs-one-idle": two_procs_one_idle,
            "cpu-tail": cpu_tail,
            "healthy": healthy,
            "host-bound": host_bound,
            "ranks-one-gpu": ranks_one_gpu,
            "killed-at-limit": killed_at_limit,
        }[args.pattern]
        result = fn(args.seconds, args.dry)
        result["pattern"] = args.pattern
    result["wall_s"] = round(time.time() - t0, 2)
    result["pid"] = os.getpid()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
