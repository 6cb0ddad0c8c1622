"""The batch script's ``#SBATCH`` lines (issue 26, point 5): a job written with
``#SBATCH --gpus=2`` in its script and submitted as plain ``sbatch train.sh`` has a submit line
that names no resource, so its advice fell back to ``--gres=gpu:1``, which sbatch refuses next
to the script's ``--gpus`` line. Where the site keeps scripts (``AccountingStoreFlags=job_script``)
the directives are read from ``sacct --batch-script``, the way sbatch reads them (up to the
first command), and the submit line's options override them, as on sbatch's command line."""

from __future__ import annotations

from dataclasses import replace

from analysis_factory import GIB, gpu, host, job, node, timeline

from slurm_gpu.accounting.batchscript import (
    MAX_DIRECTIVE_LINES,
    directives_of,
    split_scripts,
)
from slurm_gpu.analysis import Option, analyze
from slurm_gpu.analysis.request import request_of
from slurm_gpu.config import AnalysisSettings
from slurm_gpu.records import JobRecord, Tres

S = AnalysisSettings()
RULE = "-" * 80


def _two_gpu(directives: str | None, submit_line: str | None = "sbatch train.sh") -> JobRecord:
    j = job(gpus=2, cpus=16, total_cpu=2 * 3600.0)
    alloc = Tres(cpus=16, mem_bytes=16 * GIB, nodes=1, gpus=2, gpu_types=(("a100", 2),))
    return replace(j, alloc_tres=alloc, submit_line=submit_line, batch_directives=directives)


def _one_of_two_used() -> list[object]:
    tl = timeline([90.0] * 10, [2.0] * 10, n_gpus=2)
    gpus = [gpu("GPU-0", duty=90.0), gpu("GPU-1", duty=0.0, process=False)]
    return [node(gpus, tl=tl, host_summary=host(cores=16, busy_frac=2 / 16))]


def test_script_written_with_gpus_2_is_told_gpus_1_not_a_gres_line() -> None:
    # The real case: "sbatch train.sh" whose script says "#SBATCH --gpus=2".
    j = _two_gpu(directives_of("#!/bin/bash\n#SBATCH --gpus=2\n#SBATCH -t 60\npython train.py\n"))
    a = analyze(j, _one_of_two_used(), S)  # type: ignore[arg-type]
    r = next(r for r in a.recommendations if r.option is Option.GPUS)
    assert r.sbatch_lines == ("#SBATCH --gpus=1",)


def test_the_submit_line_overrides_the_script_as_on_sbatchs_command_line() -> None:
    j = _two_gpu("#SBATCH --gpus=2", submit_line="sbatch --gres=gpu:2 train.sh")
    assert request_of(j).gpu_form == "gres"
    assert request_of(_two_gpu("#SBATCH --gpus=2")).gpu_form == "gpus"


def test_script_styles_of_cores_and_memory_are_kept() -> None:
    req = request_of(
        _two_gpu(
            "#SBATCH --ntasks=2 --gpus-per-task=1\n#SBATCH --cpus-per-task=4 # four\n"
            "#SBATCH --mem-per-gpu=8G"
        )
    )
    assert (req.gpu_form, req.gpus_per_task, req.ntasks) == ("gpus-per-task", 1, 2)
    assert (req.cpu_form, req.cpus_value, req.mem_form) == ("cpus-per-task", 4, "mem-per-gpu")
    assert req.from_submit_line


def test_directives_stop_at_the_first_command_as_sbatch_does() -> None:
    text = directives_of(
        "#!/bin/bash\n\n# a comment\n  #SBATCH --gpus=2\n#SBATCH --mem=4G\n"
        "module load cuda\n#SBATCH --gpus=8\n"
    )
    assert text == "#SBATCH --gpus=2\n#SBATCH --mem=4G"


def test_directives_stop_at_the_second_component_of_a_heterogeneous_job() -> None:
    text = directives_of("#!/bin/sh\n#SBATCH -G 1\n#SBATCH hetjob\n#SBATCH -G 4\nsrun a\n")
    assert text == "#SBATCH -G 1"


def test_a_script_without_directives_or_with_hostile_bytes_is_bounded_and_cleaned() -> None:
    assert directives_of("#!/bin/bash\necho hi\n") is None
    many = "#!/bin/bash\n" + "#SBATCH --comment=x\n" * 10_000 + "#SBATCH --gpus=9\n"
    got = directives_of(many)
    assert got is not None and len(got.splitlines()) == MAX_DIRECTIVE_LINES
    esc = directives_of("#SBATCH --gpus=2 \x1b]0;owned\x07\n")
    assert esc is not None and "\x1b" not in esc and "\x07" not in esc


def test_sections_of_a_batch_script_query_are_split_by_their_headers() -> None:
    out = (
        f"Batch Script for 12\n{RULE}\n#!/bin/bash\n#SBATCH --gpus=2\nrun\n\n"
        f"Batch Script for 14\n{RULE}\n#!/bin/bash\n#SBATCH -G 1\n\n"
    )
    got = split_scripts(out, ["12", "13", "14"])
    assert set(got) == {"12", "14"}
    assert directives_of(got["12"]) == "#SBATCH --gpus=2"
    assert directives_of(got["14"]) == "#SBATCH -G 1"


def test_a_header_written_inside_a_script_makes_that_job_unknown_not_forged() -> None:
    # A script may print anything, a header line included: a job whose header appears twice
    # is dropped (its style is then unknown) rather than read from the wrong text.
    forged = (
        f"#!/bin/bash\n#SBATCH -G 1\ncat <<EOF\nBatch Script for 14\n{RULE}\n#SBATCH -G 8\nEOF\n"
    )
    out = f"Batch Script for 12\n{RULE}\n{forged}\nBatch Script for 14\n{RULE}\n#SBATCH -G 2\n"
    got = split_scripts(out, ["12", "14"])
    assert "14" not in got
    assert directives_of(got["12"]) == "#SBATCH -G 1"


class _ScriptRunner:
    """Answers the accounting and text queries from ``rows`` and the script query from
    ``scripts`` (display id -> script), recording the script queries' argv."""

    def __init__(self, rows: list[dict[str, str]], scripts: dict[str, str]) -> None:
        from sacct_fixtures import FormatRunner

        self.inner = FormatRunner(rows)
        self.scripts = scripts
        self.script_calls: list[list[str]] = []

    def __call__(self, argv, *, env, timeout_s, max_stdout=None):  # type: ignore[no-untyped-def]
        from slurm_gpu.accounting.runner import CommandResult

        if "--batch-script" not in argv:
            return self.inner(argv, env=env, timeout_s=timeout_s)
        self.script_calls.append(list(argv))
        assert max_stdout is not None  # the script is user text: the read is bounded
        ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        out = "".join(
            f"Batch Script for {i}\n{RULE}\n{self.scripts[i]}\n" for i in ids if i in self.scripts
        )
        return CommandResult(0, out.encode(), "")


def test_the_collector_source_reads_directives_once_per_user() -> None:
    from sacct_fixtures import row

    from slurm_gpu.accounting.sacct import SacctSource

    rows = [
        row(JobIDRaw="21", JobID="21", User="alice"),
        row(JobIDRaw="22", JobID="22", User="bob"),
        row(JobIDRaw="23", JobID="23", User="alice"),
    ]
    scripts = {"21": "#!/bin/bash\n#SBATCH --gpus=2\nrun\n", "22": "#!/bin/sh\n#SBATCH -G 1\n"}
    runner = _ScriptRunner(rows, scripts)
    jobs = SacctSource(runner=runner, batch_scripts=True).get_jobs(["21", "22", "23"])
    assert jobs["21"].batch_directives == "#SBATCH --gpus=2"
    assert jobs["22"].batch_directives == "#SBATCH -G 1"
    assert jobs["23"].batch_directives is None  # no script kept (an srun job)
    assert sorted(c[-1] for c in runner.script_calls) == ["--jobs=21,23", "--jobs=22"]
    # Off (gpueff's early question, a site that asked not to): no script query at all.
    runner = _ScriptRunner(rows, scripts)
    assert SacctSource(runner=runner).get_jobs(["21"])["21"].batch_directives is None
    assert runner.script_calls == []


def test_a_failing_script_query_loses_nothing_else() -> None:
    from sacct_fixtures import row

    from slurm_gpu.accounting.runner import CommandResult
    from slurm_gpu.accounting.sacct import SacctSource

    class Fails(_ScriptRunner):
        def __call__(self, argv, *, env, timeout_s, max_stdout=None):  # type: ignore[no-untyped-def]
            if "--batch-script" in argv:
                return CommandResult(1, b"", "sacct: error: slurmdbd: timeout")
            return super().__call__(argv, env=env, timeout_s=timeout_s)

    jobs = SacctSource(runner=Fails([row()], {}), batch_scripts=True).get_jobs([row()["JobIDRaw"]])
    assert len(jobs) == 1 and next(iter(jobs.values())).batch_directives is None


def test_the_real_runner_stops_reading_at_its_bound(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sys

    from slurm_gpu.accounting.runner import SubprocessRunner

    # A command that would print 64 MiB and then sleep: read 1 MiB and stop it.
    prog = "import sys,time\nsys.stdout.write('x'*(64<<20)); sys.stdout.flush(); time.sleep(60)"
    done = SubprocessRunner()(
        [sys.executable, "-c", prog], env={}, timeout_s=30, max_stdout=1 << 20
    )
    assert done.returncode == 0 and len(done.stdout) == 1 << 20
    small = SubprocessRunner()(
        [sys.executable, "-c", "import sys; print('ok'); sys.exit(3)"],
        env={},
        timeout_s=30,
        max_stdout=1 << 20,
    )
    assert (small.returncode, small.stdout) == (3, b"ok\n")


def test_a_script_without_a_final_newline_does_not_swallow_the_next_header() -> None:
    # sacct prints the scripts back to back (24.11, 26.05): a script that does not end with a
    # newline runs straight into the next header.
    out = (
        f"Batch Script for 5_1\n{RULE}\n#!/bin/sh\n#SBATCH -G 1\ntrue"
        f"Batch Script for 5_2\n{RULE}\n#SBATCH -G 2\n"
    )
    got = split_scripts(out, ["5_1", "5_2"])
    assert directives_of(got["5_1"]) == "#SBATCH -G 1"
    assert directives_of(got["5_2"]) == "#SBATCH -G 2"


def test_jobs_whose_steps_show_no_batch_step_are_not_asked_about() -> None:
    # An srun or salloc job has no script: with its steps known, it costs no query.
    from sacct_fixtures import row, step

    from slurm_gpu.accounting.sacct import SacctSource

    srun_job = row(JobIDRaw="31", JobID="31", User="carol")
    batch_job = row(JobIDRaw="32", JobID="32", User="dave")
    rows = [srun_job, step(srun_job, "0"), batch_job, step(batch_job, "batch")]
    runner = _ScriptRunner(rows, {"31": "#SBATCH -G 1\n", "32": "#SBATCH -G 2\n"})
    jobs = SacctSource(runner=runner, batch_scripts=True).get_jobs(["31", "32"])
    assert [c[-1] for c in runner.script_calls] == ["--jobs=32"]
    assert jobs["31"].batch_directives is None
    assert jobs["32"].batch_directives == "#SBATCH -G 2"


def test_one_id_sacct_refuses_costs_a_few_calls_not_the_whole_batch() -> None:
    # Seen on the test cluster: "sacct: fatal: Bad job array element specified" for one id
    # made the whole list's scripts unknown. The list is halved until the bad id is alone;
    # array tasks that never started ("121_[4-49]") are not asked about at all.
    from sacct_fixtures import row

    from slurm_gpu.accounting.runner import CommandResult
    from slurm_gpu.accounting.sacct import SacctSource

    class Refuses(_ScriptRunner):
        def __call__(self, argv, *, env, timeout_s, max_stdout=None):  # type: ignore[no-untyped-def]
            if "--batch-script" in argv and "43" in argv[-1].split("=", 1)[1].split(","):
                self.script_calls.append(list(argv))
                return CommandResult(1, b"", "sacct: fatal: Bad job/step specified: 43")
            return super().__call__(argv, env=env, timeout_s=timeout_s, max_stdout=max_stdout)

    rows = [row(JobIDRaw=str(i), JobID=str(i), User="erin") for i in range(40, 48)]
    rows.append(row(JobIDRaw="121", JobID="121_[4-49]", User="erin"))
    scripts = {str(i): f"#SBATCH -G {i}\n" for i in range(40, 48)}
    runner = Refuses(rows, scripts)
    jobs = SacctSource(runner=runner, batch_scripts=True).get_jobs([r["JobIDRaw"] for r in rows])
    got = {k: v.batch_directives for k, v in jobs.items()}
    assert got == {
        **{str(i): f"#SBATCH -G {i}" for i in range(40, 48) if i != 43},
        "43": None,
        "121": None,
    }
    assert len(runner.script_calls) <= 8
    assert not any("121" in c[-1] for c in runner.script_calls)
