"""The demo's e-mails on a fresh machine (issue 14): before the first collection there is no
store file, and slurmctld runs the mail program (as SlurmUser) as soon as a job ends, long
before the demo collects. Every demo job that asked for mail must still get its enriched
message through the real SMTP sink, and the demo's summary must count it as enriched.

The store file and the mail state are moved aside for the run (the cluster's own
``slurm-gpu.toml`` is the one the MailProg wrapper has baked in, so a copy pointed elsewhere
would not reach it) and put back afterwards, whatever happens. Uses port 8025 like ``make
demo``, so it cannot share the machine with a running demo or ``test_mail_cluster.py``.
"""

from __future__ import annotations

import email
import email.policy
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import slurmtools

from slurm_gpu.config import load_settings
from slurm_gpu.demo.submit import MAILED

pytestmark = pytest.mark.cluster

#: SQLite's companions of a database file, moved with it.
_SIDE = ("", "-journal", "-wal", "-shm")


@contextmanager
def moved_aside(files: Sequence[Path]) -> Iterator[None]:
    """Rename each existing file (and its SQLite companions) to ``NAME.aside-PID``; afterwards
    remove what the run created under the original names and rename the originals back."""
    suffix = f".aside-{os.getpid()}"
    moved: list[Path] = []
    try:
        for base in files:
            for side in _SIDE:
                path = base.with_name(base.name + side)
                if path.exists():
                    path.rename(path.with_name(path.name + suffix))
                    moved.append(path)
        yield
    finally:
        for base in files:
            for side in _SIDE:
                base.with_name(base.name + side).unlink(missing_ok=True)
        for path in moved:
            path.with_name(path.name + suffix).rename(path)


def test_demo_mail_reaches_the_sink_from_a_fresh_store_and_mail_state(tmp_path: Path) -> None:
    config = slurmtools.slurm_gpu_config_path()
    settings = load_settings(str(config))
    url = settings.store_url
    assert url.startswith("sqlite:///"), f"this test moves a SQLite store aside, not {url}"
    store = Path(url.removeprefix("sqlite:///"))
    mail_state = Path(settings.mail.state_dir) / "mail-state.db"
    fallback_dir = slurmtools.tc_root() / "fallback-mail"
    out = tmp_path / "demo-output"
    slurm_gpu = str(slurmtools.venv_python().with_name("slurm-gpu"))
    with moved_aside([store, mail_state]):
        assert not store.exists() and not mail_state.exists()
        proc = subprocess.run(
            [
                slurm_gpu,
                "--config",
                str(config),
                "demo",
                "run",
                "--patterns",
                ",".join(MAILED),
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
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text
        assert store.exists(), "the demo's collection created the store"
    submitted = dict(re.findall(r"submitted (\S+)\s+job (\d+)", proc.stdout))
    assert sorted(submitted) == sorted(MAILED), text
    ids = set(submitted.values())
    named: set[str] = set()
    for path in sorted((out / "mail").glob("*.eml")):
        msg = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
        assert msg["To"] == "sgtest1@localhost"
        assert msg.get_body(preferencelist=("plain",)) is not None
        named.update(j.strip() for j in str(msg["X-Slurm-Job-Id"] or "").split(","))
    assert ids <= named, f"no enriched e-mail for {sorted(ids - named)}\n{text}"
    plain = {p.name.partition(".")[0] for p in fallback_dir.iterdir()} & ids
    assert not plain, f"plain fallback mail for {sorted(plain)}"
    n = len(MAILED)
    assert f"{n} jobs asked for mail: {n} enriched" in proc.stdout, text
    assert "0 plain fallback" in proc.stdout, text
