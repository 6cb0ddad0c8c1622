"""``python -m slurm_gpu.hooks prolog|epilog``: the entry point the wrapper scripts run.

Catches everything, logs it with the job id, and exits 0 within ``hooks.hook_timeout_s``:
a non-zero prolog or epilog exit drains the node. Never calls a Slurm command.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from types import FrameType

from slurm_gpu.hooks.common import JobEnv, setup_logging

DEFAULT_TIMEOUT_S = 20.0


class HookTimeout(BaseException):
    """Raised by the alarm when a hook runs past its budget (BaseException: not swallowed by
    the ``except Exception`` around individual steps)."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise HookTimeout()


def _log_file_from_broken_config(path: str | None) -> str:
    """Best effort: the ``log_file = "..."`` line of a config file that failed to parse, so
    the failure is logged where the site looks, not only to syslog. Never from a file that is
    not trusted: its log_file would make root create and append to a file of its writer's
    choosing."""
    from slurm_gpu.trust import UntrustedPathError, open_trusted_file

    if not path:
        return ""
    try:
        # Read from the descriptor that was checked, not the name again.
        with os.fdopen(open_trusted_file(path), encoding="utf-8", errors="replace") as fh:
            text = fh.read(65536)
    except (UntrustedPathError, OSError):
        return ""
    m = re.search(r'^\s*log_file\s*=\s*"([^"\n]*)"', text, re.MULTILINE)
    return m.group(1) if m else ""


def main(argv: list[str] | None = None) -> int:
    """Run one hook; always returns 0."""
    t0 = time.monotonic()
    args = sys.argv[1:] if argv is None else argv
    hook = args[0] if args else ""
    env = JobEnv.from_environ(os.environ)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(int(DEFAULT_TIMEOUT_S))
    log = None
    try:
        from slurm_gpu.config import config_path, load_settings  # noqa: TID251 (a composition root reads the config)

        try:
            settings = load_settings(trusted=True)
        except Exception as exc:
            path, _explicit = config_path()
            log = setup_logging(_log_file_from_broken_config(path), hook or "hook", env.job_id)
            log.error(
                "%s: configuration unusable, doing nothing: %s (%.3fs)",
                hook,
                exc,
                time.monotonic() - t0,
            )
            return 0
        # Leave a little of the budget for logging the timeout itself.
        budget = max(1.0, settings.hooks.hook_timeout_s - 0.5)
        signal.setitimer(signal.ITIMER_REAL, max(0.1, budget - (time.monotonic() - t0)))
        log = setup_logging(settings.paths.log_file, hook or "hook", env.job_id)
        if hook == "prolog":
            from slurm_gpu.hooks.prolog import run_prolog

            outcome = run_prolog(settings, env)
        elif hook == "epilog":
            from slurm_gpu.hooks.epilog import run_epilog

            outcome = run_epilog(settings, env)
        else:
            outcome = f"unknown hook {hook!r} (use prolog or epilog); nothing done"
        log.info("%s: %s (%.3fs)", hook, outcome, time.monotonic() - t0)
    except HookTimeout:
        if log is not None:
            log.error("%s: timed out, gave up (%.3fs)", hook, time.monotonic() - t0)
    except BaseException as exc:
        try:
            if log is None:
                log = setup_logging("", hook or "hook", env.job_id)
            log.exception(
                "%s: failed: %s: %s (%.3fs)", hook, type(exc).__name__, exc, time.monotonic() - t0
            )
        except BaseException:
            pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return 0


if __name__ == "__main__":
    try:
        main()
    finally:
        os._exit(0)
