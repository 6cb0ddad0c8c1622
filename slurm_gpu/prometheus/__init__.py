"""Prometheus, the adapter: its HTTP API (``client``, the only module that speaks HTTP to it)
and slurm-gpu's own exporter series read back as live jobs (``livejobs``).

Used by the live view and policy (``live``), the telemetry sources (``sources``) and a running
job's report (``jobreport``); it imports only the shared layer.
"""
