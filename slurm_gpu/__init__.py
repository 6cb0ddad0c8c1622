"""slurm-gpu: per-job GPU telemetry, diagnosis and reports for Slurm clusters."""

from slurm_gpu import methodcache as _methodcache

__version__ = "0.1.0"

# Before any of the package's modules defines its records: their generated methods are then
# taken from the tables beside the byte code instead of being compiled at every start.
_methodcache.install()
