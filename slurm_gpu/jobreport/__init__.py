"""The per-job report people read: ``gpueff JOBID`` and the body of the e-mail after a job.

View model (``model``), the adapter from stored records and findings (``adapter``), the
terminal, JSON and HTML renderers, the e-mail's charts (``charts``), the readers of the store
and of live summaries (``readers``), and the reports rendered at collection (``reportcache``).
"""
