"""Demo workloads: processes that drive virtual GPUs the way real training drives real ones.

Run inside a Slurm job as ``python -m slurm_gpu.demo PATTERN``; each pattern reproduces one of
the causes of low GPU utilization (see ``docs/telemetry.md``).
"""
