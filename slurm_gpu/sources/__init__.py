"""Telemetry sources other than the node's own hooks: a site's existing monitoring.

Each source turns what it can read for one finished job (Prometheus series of dcgm-exporter,
of the jobstats exporters or of our own exporter; Slurm accounting's per-step GPU TRES) into
the same ``NodeRecord`` objects the hooks seal, through the same streaming aggregates, with
what it could not provide left unknown (``None``), never zero. See ``base.TelemetrySource``.
"""
