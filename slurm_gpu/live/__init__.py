"""Live view of running GPU jobs: the node's exposition (``snapshot``, ``exposition``,
``exporter``) and the admin's view and policy (``view``, ``policy``, ``police``; Prometheus is
read through ``slurm_gpu.prometheus``).

The node-side modules read only the samplers' live summaries through ``capture.spool``; they
never import the central side.
"""
