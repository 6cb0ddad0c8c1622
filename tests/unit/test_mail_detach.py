"""The mail program's detached child must let go of slurmctld's pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import sys
from slurm_gpu.cli.mail_cmd import release_stdio
release_stdio()
sys.stderr.write("after release\\n"); sys.stderr.flush()
sys.stdout.write("after release\\n"); sys.stdout.flush()
import time; time.sleep(0.2)
"""


def test_piped_output_is_released() -> None:
    """With stdout and stderr on a pipe (as slurmctld runs MailProg), nothing the child
    writes after the release reaches the pipe."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=30, check=True
    )
    assert proc.stdout == "" and proc.stderr == ""


def test_stderr_to_a_log_file_is_kept(tmp_path: Path) -> None:
    log = tmp_path / "mailprog.log"
    with open(log, "w") as fh:
        subprocess.run(
            [sys.executable, "-c", CHILD],
            stdout=subprocess.PIPE,
            stderr=fh,
            timeout=30,
            check=True,
        )
    assert log.read_text() == "after release\n"
    assert os.path.getsize(log) > 0
