"""``slurm-gpu police``: the live policy's decisions, its actions, its records and its
refusals to act on incomplete data."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from slurm_gpu.accounting.runner import CommandResult
from slurm_gpu.cli.admin import cli
from slurm_gpu.errors import AccountingError
from slurm_gpu.live.police import PoliceOptions, run_pass
from slurm_gpu.live.policy import PolicyConfig, SlurmJob, decide
from slurm_gpu.notify.transport import DirMailer
from slurm_gpu.records import LiveGpu, LiveJob
from slurm_gpu.store import Store, migrations, schema
from slurm_gpu.store.liveactions import LiveAction, actions_for

NOW = 10_000_000.0
HOUR = 3600.0


def gpu(uuid: str, *, used: bool, idle_for_s: float | None, age_s: float = 4 * HOUR) -> LiveGpu:
    return LiveGpu(
        uuid=uuid,
        available=True,
        utilization_pct=0.0 if idle_for_s is not None else 80.0,
        utilization_recent_pct=0.0 if idle_for_s is not None else 80.0,
        utilization_mean_pct=None,
        recent_window_s=900.0,
        busy_s=0.0 if not used else age_s / 2,
        sampled_s=age_s,
        idle_since_s=None if idle_for_s is None else NOW - idle_for_s,
        active_first_s=NOW - age_s if used else None,
        memory_used_bytes=None,
        memory_total_bytes=None,
        memory_used_max_bytes=None,
        power_w=None,
        energy_j=None,
    )


def part(
    job_id: str,
    host: str,
    gpus: Sequence[LiveGpu],
    *,
    user: str = "alice",
    updated_ago_s: float = 5.0,
    age_s: float = 4 * HOUR,
) -> LiveJob:
    return LiveJob(
        job_id=job_id,
        host=host,
        user=user,
        account="physics",
        partition="gpu",
        uid=None,
        started_s=NOW - age_s,
        updated_s=NOW - updated_ago_s,
        interval_s=10.0,
        cpu_time_s=None,
        rss_bytes=None,
        allocated_cores=None,
        gpus=tuple(gpus),
    )


def slurm(
    job_id: str, *nodes: str, user: str = "alice", account: str = "physics", qos: str = "normal"
) -> SlurmJob:
    return SlurmJob(job_id, user, account, "gpu", qos, nodes or ("n1",))


IDLE = [gpu("GPU-a", used=True, idle_for_s=2 * HOUR), gpu("GPU-b", used=True, idle_for_s=None)]
NEVER = [gpu("GPU-c", used=False, idle_for_s=4 * HOUR)]
HEALTHY = [gpu("GPU-d", used=True, idle_for_s=None)]


def acts(decisions: Sequence[object]) -> dict[tuple[str, str], str]:
    return {(d.job_id, d.rule): d.action for d in decisions if d.action != "skip"}  # type: ignore[attr-defined]


def warned(
    job_id: str, rule: str, at_s: float, user: str = "alice", action: str = "warned"
) -> LiveAction:
    return LiveAction(job_id, rule, action, user, "physics", at_s, 1, 3600.0, "")


def test_an_idle_gpu_is_warned_and_a_healthy_job_is_not() -> None:
    live = [part("1", "n1", IDLE), part("2", "n1", HEALTHY, user="bob")]
    out = decide(live, {"1": slurm("1"), "2": slurm("2", user="bob")}, [], PolicyConfig(), NOW)
    assert acts(out) == {("1", "idle"): "warn"}
    [d] = [d for d in out if d.action == "warn"]
    assert d.gpus == 1 and d.user == "alice" and "GPU-a" in d.evidence[0]


def test_a_never_used_gpu_is_its_own_rule() -> None:
    out = decide([part("3", "n1", NEVER)], {"3": slurm("3")}, [], PolicyConfig(), NOW)
    assert acts(out) == {("3", "never_used"): "warn"}


@pytest.mark.parametrize(
    ("live", "nodes", "why"),
    [
        ([part("1", "n1", IDLE)], ("n1", "n2"), "partial data: no live data from n2"),
        ([part("1", "n1", IDLE, updated_ago_s=600.0)], ("n1",), "stale data"),
        (
            [part("1", "n1", [dataclasses.replace(IDLE[0], sampled_s=HOUR)])],
            ("n1",),
            "gaps",
        ),
        ([part("1", "n1", IDLE, age_s=600.0)], ("n1",), "in its start-up grace"),
    ],
)
def test_police_never_acts_on_partial_stale_or_gappy_data(
    live: list[LiveJob], nodes: tuple[str, ...], why: str
) -> None:
    out = decide(live, {"1": slurm("1", *nodes)}, [], PolicyConfig(cancel=True), NOW)
    assert acts(out) == {}
    assert out[0].reason.startswith(why)


def test_a_job_slurm_does_not_list_is_left_alone() -> None:
    out = decide([part("1", "n1", IDLE)], {}, [], PolicyConfig(), NOW)
    assert acts(out) == {} and "does not list" in out[0].reason


def test_one_warning_per_job_and_rule_when_cancellation_is_off() -> None:
    past = [warned("1", "idle", NOW - 10 * HOUR)]
    out = decide([part("1", "n1", IDLE)], {"1": slurm("1")}, past, PolicyConfig(), NOW)
    assert acts(out) == {} and out[0].reason == "already warned; cancellation is off"


def test_warnings_are_throttled_per_user() -> None:
    live = [part("1", "n1", IDLE), part("2", "n1", NEVER)]
    out = decide(live, {"1": slurm("1"), "2": slurm("2")}, [], PolicyConfig(), NOW)
    # The worst job (most idle GPU-seconds: job 2's never-used GPU) is warned; job 1 waits.
    assert acts(out) == {("2", "never_used"): "warn"}
    assert any(d.reason.startswith("user warned recently") for d in out)
    later = decide(
        live,
        {"1": slurm("1"), "2": slurm("2")},
        [warned("2", "never_used", NOW - 2 * HOUR)],
        PolicyConfig(),
        NOW,
    )
    assert acts(later) == {("1", "idle"): "warn"}


def test_cancellation_comes_after_n_warnings_and_the_grace_period() -> None:
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=2, cancel_grace_s=HOUR)
    live, jobs = [part("1", "n1", IDLE)], {"1": slurm("1")}
    first = [warned("1", "idle", NOW - 0.5 * HOUR)]
    assert decide(live, jobs, first, cfg, NOW)[0].reason.startswith("in the grace period")
    first = [warned("1", "idle", NOW - 2 * HOUR)]
    assert acts(decide(live, jobs, first, cfg, NOW)) == {("1", "idle"): "warn"}  # 2 of 2
    both = [*first, warned("1", "idle", NOW - 1.5 * HOUR)]
    assert acts(decide(live, jobs, both, cfg, NOW)) == {("1", "idle"): "cancel"}


def test_an_exempt_account_is_warned_but_never_cancelled() -> None:
    cfg = PolicyConfig(
        cancel=True,
        cancel_after_warnings=1,
        cancel_grace_s=0.0,
        exempt_accounts=frozenset({"physics"}),
    )
    live, jobs = [part("1", "n1", IDLE)], {"1": slurm("1")}
    assert acts(decide(live, jobs, [], cfg, NOW)) == {("1", "idle"): "warn"}
    out = decide(live, jobs, [warned("1", "idle", NOW - HOUR)], cfg, NOW)
    assert acts(out) == {} and "exempt account physics" in out[0].reason


def test_cancellations_per_pass_are_capped_worst_first() -> None:
    cfg = PolicyConfig(
        cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0, max_cancels_per_pass=1
    )
    live = [part("1", "n1", IDLE), part("2", "n2", NEVER, user="bob")]
    jobs = {"1": slurm("1"), "2": slurm("2", "n2", user="bob")}
    past = [warned("1", "idle", NOW - HOUR), warned("2", "never_used", NOW - HOUR, user="bob")]
    out = decide(live, jobs, past, cfg, NOW)
    assert acts(out) == {("2", "never_used"): "cancel"}
    assert any(d.reason == "cancellation cap of this pass reached" for d in out)


def test_dry_run_records_do_not_count_as_real_warnings() -> None:
    past = [warned("1", "idle", NOW - HOUR, action="would_warn")]
    out = decide([part("1", "n1", IDLE)], {"1": slurm("1")}, past, PolicyConfig(), NOW)
    assert acts(out) == {("1", "idle"): "warn"}


# --------------------------------------------------------------------------- the pass


class Runner:
    """The command-runner seam: a fixed squeue answer; records every command."""

    def __init__(self, squeue: bytes, rc: int = 0) -> None:
        self.squeue, self.rc = squeue, rc
        self.calls: list[list[str]] = []

    def __call__(
        self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float
    ) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0].endswith("squeue"):
            return CommandResult(self.rc, self.squeue, "slurmctld down" if self.rc else "")
        return CommandResult(0, b"", "")


OPTS = PoliceOptions("/usr/bin", 10.0, "example.org", "slurm-gpu@example.org", ("ops@example.org",))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path}/store.db")


def test_a_pass_mails_one_warning_records_it_and_does_not_repeat(
    store: Store, tmp_path: Path
) -> None:
    live = [part("1", "n1", IDLE), part("2", "n1", HEALTHY, user="bob")]
    runner = Runner(b"1|alice|physics|gpu|normal|n1\n2|bob|physics|gpu|normal|n1\n")
    mailer = DirMailer(str(tmp_path / "mail"))
    result = run_pass(lambda: live, runner, store.engine, mailer, PolicyConfig(), OPTS, NOW)
    assert [(a.job_id, a.action, a.rule) for a in result.done] == [("1", "warned", "idle")]
    (warning, to), (digest, admins) = mailer.sent
    assert to == ("alice@example.org",) and admins == ("ops@example.org",)
    body = warning.get_content()
    assert "scancel 1" in body and "gpueff 1" in body and "GPU-a" in body
    assert "1 warned, 0 cancelled" in digest["Subject"]
    again = run_pass(lambda: live, runner, store.engine, mailer, PolicyConfig(), OPTS, NOW + 600)
    assert again.done == () and len(mailer.sent) == 2
    assert [a.action for a in actions_for(store.engine, ["1"], [], 0.0)] == ["warned"]


def test_a_cancellation_writes_the_reason_where_sacct_shows_it_then_scancels(
    store: Store, tmp_path: Path
) -> None:
    cfg = PolicyConfig(cancel=True, cancel_after_warnings=1, cancel_grace_s=0.0)
    from slurm_gpu.store.liveactions import record_actions

    record_actions(store.engine, [warned("1", "idle", NOW - HOUR)])
    runner = Runner(b"1|alice|physics|gpu|normal|n1\n")
    result = run_pass(
        lambda: [part("1", "n1", IDLE)],
        runner,
        store.engine,
        DirMailer(str(tmp_path / "m")),
        cfg,
        OPTS,
        NOW,
    )
    assert [a.action for a in result.done] == ["cancelled"]
    update, cancel = runner.calls[1:]
    assert update[:3] == ["/usr/bin/scontrol", "update", "JobId=1"]
    assert update[3].startswith("AdminComment=slurm-gpu police: cancelled")
    assert cancel == ["/usr/bin/scancel", "1"]


def test_dry_run_records_would_warn_and_sends_nothing(store: Store, tmp_path: Path) -> None:
    mailer = DirMailer(str(tmp_path / "mail"))
    runner = Runner(b"1|alice|physics|gpu|normal|n1\n")
    result = run_pass(
        lambda: [part("1", "n1", IDLE)],
        runner,
        store.engine,
        mailer,
        PolicyConfig(dry_run=True),
        dataclasses.replace(OPTS, admin_emails=()),
        NOW,
    )
    assert [a.action for a in result.done] == ["would_warn"] and mailer.sent == []


def test_squeue_failing_ends_the_pass_before_any_action(store: Store, tmp_path: Path) -> None:
    mailer = DirMailer(str(tmp_path / "mail"))
    with pytest.raises(AccountingError):
        run_pass(
            lambda: [part("1", "n1", IDLE)],
            Runner(b"", rc=1),
            store.engine,
            mailer,
            PolicyConfig(),
            OPTS,
            NOW,
        )
    assert mailer.sent == [] and actions_for(store.engine, ["1"], ["alice"], 0.0) == []


def test_police_exits_7_and_acts_on_nothing_when_prometheus_is_unreachable(
    store: Store, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\n'
        f'[store]\nurl = "sqlite:///{tmp_path}/store.db"\n'
        f'[live]\nprometheus_url = "http://127.0.0.1:{port}"\nprometheus_timeout_s = 2\n'
    )
    result = CliRunner().invoke(
        cli, ["--config", str(cfg), "police", "--mail-dir", str(tmp_path / "mail")]
    )
    assert result.exit_code == 7, result.output
    assert not (tmp_path / "mail").exists()


def test_police_exits_6_when_the_store_is_not_migrated(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[paths]\nspool_dir = "{tmp_path}/spool"\n[store]\nurl = "sqlite:///{tmp_path}/s.db"\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(cfg), "police"])
    assert result.exit_code == 6 and "store migrate" in result.output


def test_a_version_6_store_migrates_to_the_live_actions_table(store: Store) -> None:
    with migrations.write_transaction(store.engine) as conn:
        schema.live_actions.drop(conn)
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version > 6))
    applied = migrations.migrate(store.engine)
    assert applied[0].version == 7  # then the later ones
    assert actions_for(store.engine, ["1"], [], 0.0) == []
