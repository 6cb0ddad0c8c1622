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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

PATTERNS = ("small-batch", "dataloader", "two-procs-one-idle", "cpu-tail", "healthy")

#: Samples per step of ``small-batch`` (``--batch``).
BATCH = 4
#: CPU seconds of ``dataloader``'s transform per sample (``--transform-ms``).
TRANSFORM_S = 0.02


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


def two_procs_one_idle(seconds: float, dry: bool) -> dict[str, Any]:
    """The parent starts both ranks (as srun would) and waits for them."""
    ranks = []
    for rank in (0, 1):
        argv = [sys.executable, __file__, "--rank", str(rank), "--seconds", str(seconds)]
        ranks.append(subprocess.Popen(argv + (["--dry"] if dry else []), stdout=subprocess.PIPE))
    out = [json.loads(p.communicate()[0] or b"{}") for p in ranks]
    return {"ranks": out, "exit_codes": [p.returncode for p in ranks]}


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


def healthy(seconds: float, dry: bool) -> dict[str, Any]:
    torch = _torch(dry)
    if torch is None:
        return {"rounds": _cpu_work(seconds)}
    return {"steps": _busy_gpu(torch, seconds, n=8192)}


def main() -> None:
    global BATCH, TRANSFORM_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pattern", nargs="?", choices=PATTERNS)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dry", action="store_true", help="no GPU: keep the shapes on the CPU")
    parser.add_argument("--batch", type=int, default=BATCH, help="small-batch: samples a step")
    parser.add_argument(
        "--transform-ms", type=float, default=TRANSFORM_S * 1000, help="dataloader: per sample"
    )
    args = parser.parse_args()
    BATCH, TRANSFORM_S = args.batch, args.transform_ms / 1000.0
    t0 = time.time()
    if args.rank is not None:
        result = rank(args.rank, args.seconds, args.dry)
    else:
        fn = {
            "small-batch": small_batch,
            "dataloader": dataloader,
            "two-procs-one-idle": two_procs_one_idle,
            "cpu-tail": cpu_tail,
            "healthy": healthy,
        }[args.pattern]
        result = fn(args.seconds, args.dry)
        result["pattern"] = args.pattern
    result["wall_s"] = round(time.time() - t0, 2)
    result["pid"] = os.getpid()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
