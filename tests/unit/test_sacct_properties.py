"""Property tests: the sacct parser never crashes and round-trips free text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sacct_fixtures import parse_rows, render, row, step

from slurm_gpu.accounting.sacct import DELIM, FIELDS, parse_sacct_output
from slurm_gpu.accounting.usertext import COMMENT_MAX_LEN, JOB_NAME_MAX_LEN
from slurm_gpu.textsafe import clean_user_text

# Job names as users write them: any printable text, pipes, newlines, non-ASCII.
names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x1f"),
    max_size=60,
)


@settings(max_examples=300)
@given(name=names, comment=names)
def test_free_text_round_trips(name: str, comment: str) -> None:
    job = row(JobName=name, Comment=comment)
    jobs = parse_rows([job, step(job, "batch")]).jobs
    assert jobs["101"].job_name == clean_user_text(name, JOB_NAME_MAX_LEN)
    assert jobs["101"].comment == (
        clean_user_text(comment, COMMENT_MAX_LEN) or None
    ) or comment in (
        "Unknown",
        "None",
        "(null)",
        "N/A",
    )


@settings(max_examples=300)
@given(values=st.lists(st.text(max_size=20), min_size=len(FIELDS) - 1, max_size=len(FIELDS) - 1))
def test_arbitrary_field_contents_never_crash(values: list[str]) -> None:
    fields = dict(zip(FIELDS[:-1], values, strict=True))
    fields["JobIDRaw"] = "7"
    result = parse_sacct_output(render([fields]))
    assert len(result.jobs) + result.skipped >= 1


@settings(max_examples=300)
@given(blob=st.binary(max_size=400))
def test_arbitrary_bytes_never_crash(blob: bytes) -> None:
    result = parse_sacct_output(blob)
    assert result.skipped >= 0


@settings(max_examples=100)
@given(name=st.text(max_size=30))
def test_delimiter_and_newlines_inside_a_name_keep_other_fields(name: str) -> None:
    """The hostile name goes through both queries as ``SacctSource`` runs them (the text
    query framed with the accounting query's own delimiter, the worst case): the job is
    never lost and its accounting fields never move; the name is kept cleaned or dropped."""
    evil = f"{name}{DELIM}{name}\n"
    job = row(JobName=evil)
    result = parse_rows([job, step(job, "batch")])
    rec = result.jobs["101"]
    assert (rec.state, rec.user, rec.nodelist) == ("COMPLETED", "sgtest1", ("vm",))
    assert rec.job_name in (clean_user_text(evil, JOB_NAME_MAX_LEN), "")
