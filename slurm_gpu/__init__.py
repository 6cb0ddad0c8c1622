"""slurm-gpu: per-job GPU telemetry, diagnosis and reports for Slurm clusters."""

__version__ = "0.1.0"
