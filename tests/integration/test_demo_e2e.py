"""``slurm-gpu demo run`` on the real cluster, as ``make demo`` runs it (two patterns, to keep
it short): the jobs are collected, each owner's gpueff view is printed and saved, the END
e-mail arrives at the loopback SMTP sink as an .eml file, and the weekly report is written."""

from __future__ import annotations

import email
import email.policy
import subprocess
from pathlib import Path

import pytest
import slurmtools

pytestmark = pytest.mark.cluster


def test_demo_run_shows_diagnosis_mail_and_report(tmp_path: Path) -> None:
    out = tmp_path / "demo-output"
    slurm_gpu = str(slurmtools.venv_python().with_name("slurm-gpu"))
    proc = subprocess.run(
        [
            slurm_gpu,
            "--config",
            str(slurmtools.slurm_gpu_config_path()),
            "demo",
            "run",
            "--patterns",
            "idle-gpu,healthy",
            "--out",
            str(out),
            "--timeout",
            "400",
        ],
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "sgtest1$ gpueff" in text
    assert "An allocated GPU was never used (cause 6)" in text
    # The script asked --gres=gpu:2 (no type): the advice adds none (issue 26, point 5).
    assert "#SBATCH --gres=gpu:1" in text and "gpu:a100:1" not in text
    saved = sorted((out / "gpueff").glob("*.txt"))
    assert [p.name.split("-", 1)[1] for p in saved] == ["healthy.txt", "idle-gpu.txt"]
    mails = sorted((out / "mail").glob("*.eml"))
    assert len(mails) == 1, text  # only idle-gpu asked for --mail-type=END
    msg = email.message_from_bytes(mails[0].read_bytes(), policy=email.policy.default)
    assert msg["To"] == "sgtest1@localhost"
    assert "demo-idle-gpu" in str(msg["Subject"])
    assert msg.get_body(preferencelist=("plain",)) is not None
    report = (out / "weekly-report.html").read_text()
    assert "<html" in report.lower() and "sgtest1" in report
    assert str(out / "weekly-report.html") in text
