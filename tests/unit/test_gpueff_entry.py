"""gpueff's click-free entry point: it answers only the owner's stored, settled single jobs,
prints exactly what the full command prints, and steps aside in every other case."""

from __future__ import annotations

from pathlib import Path

import gpueff_factory as F
import pytest
from test_gpueff_owner import SGTEST1, SGTEST2, NeverAsked, _gpueff, _store

from slurm_gpu.cli import gpueff_entry


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _store(tmp_path, F.job())
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}"\n[gpueff]\nmin_elapsed_s = 30\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.setenv("NO_COLOR", "1")
    return tmp_path


def as_uid(monkeypatch: pytest.MonkeyPatch, uid: int) -> None:
    monkeypatch.setattr(gpueff_entry.os, "getuid", lambda: uid)


def test_owner_gets_the_same_bytes_as_the_full_command(
    stored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _gpueff(stored, monkeypatch, NeverAsked(), SGTEST1, "1001")
    assert full.exit_code == 0, full.output
    as_uid(monkeypatch, SGTEST1)
    assert gpueff_entry.fast_path(["1001"]) == full.output


@pytest.mark.parametrize(
    ("uid", "args"),
    [
        (SGTEST2, ["1001"]),  # another user's job: accounting must decide
        (SGTEST1, ["999999"]),  # not in the store
        (SGTEST1, ["--json", "1001"]),  # options take the full path
        (SGTEST1, ["1001-1003"]),  # not a plain id
        (SGTEST1, []),  # a listing
    ],
)
def test_every_other_case_takes_the_full_path(
    stored: Path, monkeypatch: pytest.MonkeyPatch, uid: int, args: list[str]
) -> None:
    as_uid(monkeypatch, uid)
    assert gpueff_entry.fast_path(args) is None


def test_a_config_option_is_honoured(stored: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = stored / "config.toml"
    monkeypatch.delenv("SLURM_GPU_CONFIG")
    as_uid(monkeypatch, SGTEST1)
    out = gpueff_entry.fast_path(["--config", str(config), "1001"])
    assert out is not None and 'Job 1001 "train-resnet"' in out
    assert gpueff_entry.fast_path(["--config", str(stored / "missing.toml"), "1001"]) is None


def test_debug_takes_the_full_path(stored: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    as_uid(monkeypatch, SGTEST1)
    monkeypatch.setenv("SLURM_GPU_DEBUG", "1")
    assert gpueff_entry.fast_path(["1001"]) is None


def test_a_broken_config_takes_the_full_path_which_reports_it(
    stored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (stored / "config.toml").write_text("[gpueff\n")
    as_uid(monkeypatch, SGTEST1)
    assert gpueff_entry.fast_path(["1001"]) is None


def fast_path_imports(config: Path, ids: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` the fast path imports for sgtest1's ``ids``, in a fresh
    interpreter (the point of the entry is what it does not import); it must answer."""
    import os
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from slurm_gpu.cli import gpueff_entry\n"
        f"os.getuid = lambda: {SGTEST1}\n"
        f"out = gpueff_entry.fast_path({ids!r})\n"
        "assert out and 'Job ' in out, out\n"
        f"print(','.join(sorted(m for m in {modules!r} if m in sys.modules)))\n"
    )
    env = {**os.environ, "SLURM_GPU_CONFIG": str(config), "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [m for m in proc.stdout.strip().split(",") if m]


def test_the_entry_does_not_import_click_on_the_fast_path(stored: Path) -> None:
    heavy = ("click", "sqlalchemy", "pandas")
    assert fast_path_imports(stored / "config.toml", ["1001"], heavy) == []


def _entry(config: Path, ids: list[str], *, close_stdout: bool = False) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the console script's ``main`` for sgtest1's ``ids`` in a
    fresh interpreter that registered an exit handler (it prints ``TEARDOWN`` when the
    interpreter is torn down). With ``close_stdout`` the reader closes its end of the pipe
    before the report is written."""
    import os
    import subprocess
    import sys

    code = (
        "import atexit, os, sys, time\n"
        "atexit.register(lambda: os.write(2, b'TEARDOWN'))\n"
        "from slurm_gpu.cli import gpueff_entry\n"
        f"os.getuid = lambda: {SGTEST1}\n"
        f"sys.argv = ['gpueff', *{ids!r}]\n"
        f"if {close_stdout!r}:\n"
        "    time.sleep(0.5)\n"  # the parent has closed its end by then
        "gpueff_entry.main()\n"
    )
    env = {**os.environ, "SLURM_GPU_CONFIG": str(config), "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    if close_stdout:
        proc.stdout.close()
        out = b""
    else:
        out = proc.stdout.read()
    err = proc.stderr.read()
    return proc.wait(timeout=60), out.decode(), err.decode()


def test_the_console_script_leaves_without_the_interpreters_teardown(
    stored: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tearing down the interpreter (freeing every module the report imported) costs the
    # fast path about an eighth of its wall time and gives a finished command nothing.
    as_uid(monkeypatch, SGTEST1)
    expected = gpueff_entry.fast_path(["1001"])
    assert isinstance(expected, str)
    code, out, err = _entry(stored / "config.toml", ["1001"])
    assert (code, out, err) == (0, expected, "")


def test_an_id_not_returned_exits_4_with_its_lines_and_no_teardown(
    stored: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # sgtest1 asks for a job accounting does not return: the refusal is printed by the entry.
    sacct = tmp_path / "sacct"
    sacct.write_text("#!/bin/sh\nexit 0\n")
    sacct.chmod(0o755)
    squeue = tmp_path / "squeue"
    squeue.write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"
    )
    squeue.chmod(0o755)
    config = stored / "config.toml"
    config.write_text(config.read_text() + f'[accounting]\nsacct_path = "{sacct}"\n')
    code, out, err = _entry(config, ["424242"])
    assert code == 4 and out == ""
    assert err.startswith("gpueff: job 424242 not found\nhint: ") and "TEARDOWN" not in err


def test_a_reader_gone_before_the_report_gets_exit_130_and_no_noise(stored: Path) -> None:
    code, _, err = _entry(stored / "config.toml", ["1001"], close_stdout=True)
    assert (code, err) == (130, "")


def test_the_short_path_runs_without_the_cyclic_collector_and_the_full_command_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The click-free path imports the report's modules and renders single jobs, then ends
    the process: it needs no collections over its import-time objects
    (``docs/performance.md``). The full command (a user's jobs over weeks) keeps it."""
    import gc

    seen: dict[str, bool] = {}

    def short(args: list[str], started: list[object]) -> None:
        seen["short"] = gc.isenabled()
        return None

    def full(early: object = None) -> None:
        seen["full"] = gc.isenabled()

    import slurm_gpu.cli.gpueff as full_mod

    monkeypatch.setattr(gpueff_entry, "fast_path", short)
    monkeypatch.setattr(full_mod, "main", full)
    assert gc.isenabled()
    try:
        gpueff_entry.main()
    finally:
        gc.enable()
    assert seen == {"short": False, "full": True}
