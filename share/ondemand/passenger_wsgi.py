"""Open OnDemand (Passenger) entry point of slurm-gpu's web page (``docs/web.md``).

OnDemand runs the app in the user's own per-user nginx, as the user: the page's
``[web] identity = "process"`` then asks accounting as that user, so Slurm decides what they
see, as for ``gpueff``. ``SLURM_GPU_CONFIG`` names the configuration file when it is not the
default ``/etc/slurm-gpu/config.toml``.
"""

import os

from slurm_gpu.cli.web_cmd import wsgi_app

application = wsgi_app(os.environ.get("SLURM_GPU_CONFIG") or None)
