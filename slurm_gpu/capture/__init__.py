"""The node side's capture, below the hooks: what runs as root on every compute node.

``sampler`` (the per-job loop), ``aggregate`` (O(1) streaming aggregates), ``hostsample`` (the
job's CPU, memory and I/O from its cgroup or processes), ``spool``/``spoolpaths`` (the spool
files and their layout), ``livefile`` (the running job's live summary), ``recordcodec`` (the
sealed record's format) and ``ship`` (moving sealed records to the collector's inbox).
Nothing here reads the configuration or imports the central side (store, analysis, reports):
``slurm_gpu.hooks`` composes it.
"""
