"""One node's transport credential pushes records for any node (issue 27, point 6).

With ``[ship] transport = "postgresql"`` the inbox row records who sent it (``sent_by =
session_user``, filled by the server) but the collector never compared it with the row's
host, nor the row's host with the host the sealed record names: root on node n1 could push
records as n2 (or as any job's node). Now each node role is bound to its host names
(``inbox_writer_hosts``, migration 10; ``grant-node ROLE --host``), and ``PgInbox.pending``
quarantines and logs any other row of a node role; such a row is never stored.

The matching logic runs here without PostgreSQL; the same against the real server is in
``tests/unit/test_pg_inbox.py`` (marked ``postgres``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store_fixtures import make_node

from slurm_gpu.capture import spool
from slurm_gpu.store.inbox import (
    InboxRow,
    PgInbox,
    record_digest,
    record_host_refusal,
    sender_refusal,
)

BINDINGS = {"node_n1": frozenset({"n1"}), "n2": frozenset({"n2"})}


def test_node_credential_cannot_push_another_nodes_records() -> None:
    assert sender_refusal("n1", "node_n1", BINDINGS) is None
    reason = sender_refusal("n2", "node_n1", BINDINGS)
    assert reason is not None and "node_n1" in reason and "n1" in reason


def test_binding_compares_short_names_without_case() -> None:
    """Variant: the host as Slurm names it, with a domain or another case."""
    assert sender_refusal("N1.cluster.example", "node_n1", BINDINGS) is None
    assert sender_refusal("n10", "node_n1", BINDINGS) is not None
    assert sender_refusal("n1x.cluster", "node_n1", BINDINGS) is not None


def test_a_node_role_bound_to_no_host_pushes_nothing() -> None:
    assert sender_refusal("n1", "stray", {"stray": frozenset()}) is not None


def test_the_stores_own_role_is_not_a_node() -> None:
    """A row sent by a role that is no inbox writer (the tables' owner) is not judged."""
    assert sender_refusal("n7", "slurmgpu", BINDINGS) is None


def test_record_naming_another_host_than_its_row_is_refused() -> None:
    """Variant: n1's credential pushes a row for n1 whose sealed bytes are n2's record."""
    assert record_host_refusal("n1", "n1.cluster") is None
    assert record_host_refusal("n1", "n2") is not None


class _FakeInbox(PgInbox):
    """``PgInbox`` with its three database steps replaced: the rows, the bindings and the
    quarantine are kept in memory."""

    def __init__(self, rows: Sequence[InboxRow], bindings: dict[str, frozenset[str]]) -> None:
        super().__init__(engine=None)  # type: ignore[arg-type]
        self.rows = list(rows)
        self._bindings = bindings
        self.held: list[tuple[InboxRow, str]] = []

    def _read(self, only: Any) -> list[InboxRow]:
        return list(self.rows)

    def bindings(self) -> dict[str, frozenset[str]]:
        return self._bindings

    def quarantine(self, row: InboxRow, reason: str) -> None:
        self.held.append((row, reason))


def _row(job: str, host: str, sent_by: str, record_host: str | None = None) -> InboxRow:
    data = spool.encode_record(make_node(job, record_host or host))
    return InboxRow(job, host, record_digest(data), 0.0, sent_by, len(data), data)


def test_pending_quarantines_and_logs_rows_a_node_pushed_for_another_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = [
        _row("1", "n1", "node_n1"),  # its own: taken
        _row("2", "n2", "node_n1"),  # n1's credential, n2's row: refused
        _row("3", "n1", "node_n1", record_host="n2"),  # n1's row holding n2's record
        _row("4", "n9", "slurmgpu"),  # the owner's own row
    ]
    inbox = _FakeInbox(rows, BINDINGS)
    with caplog.at_level(logging.WARNING, logger="slurm_gpu.store.inbox"):
        taken = inbox.pending()
    assert [r.job_id for r in taken] == ["1", "4"]
    assert sorted(r.job_id for r, _ in inbox.held) == ["2", "3"]
    assert all("quarantined" in m for m in caplog.messages) and len(caplog.messages) == 2
