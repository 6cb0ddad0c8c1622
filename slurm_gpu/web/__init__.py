"""The per-job web page (``slurm-gpu web``, ``docs/web.md``): Flask, imported only here."""
