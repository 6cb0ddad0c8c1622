"""The web page's viewer and visibility rule (``web.access``) and its idle phases
(``web.series.idle_spans``), as pure functions."""

from __future__ import annotations

import pytest

from slurm_gpu.store.visibility import Visibility
from slurm_gpu.web.access import clean_name, may_see, process_user, viewer_of
from slurm_gpu.web.series import idle_spans

PROXIES = frozenset({"10.0.0.5"})


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("alice", "alice"),
        ("alice@EXAMPLE.ORG", "alice"),
        ("a.b-c_d", "a.b-c_d"),
        ("", None),
        ("-rf", None),
        (".hidden", None),
        ("bob smith", None),
        ("bob;id", None),
        ("x" * 65, None),
        (None, None),
        (42, None),
    ],
)
def test_clean_name(raw: object, name: str | None) -> None:
    assert clean_name(raw) == name


def test_viewer_by_deployment() -> None:
    env = {"REMOTE_USER": "alice", "REMOTE_ADDR": "10.0.0.5", "HTTP_X_FORWARDED_USER": "bob"}
    kw = {"user_header": "X-Forwarded-User", "trusted_proxies": PROXIES}
    p = viewer_of(env, "process", **kw)
    assert p is not None and p.user == process_user() and p.trusted_by_slurm
    r = viewer_of(env, "remote_user", **kw)
    assert r is not None and r.user == "alice" and not r.trusted_by_slurm
    h = viewer_of(env, "header", **kw)
    assert h is not None and h.user == "bob" and not h.trusted_by_slurm
    assert viewer_of({**env, "REMOTE_ADDR": "10.0.0.6"}, "header", **kw) is None
    assert viewer_of({"REMOTE_ADDR": "10.0.0.5"}, "header", **kw) is None
    assert viewer_of({}, "remote_user", **kw) is None
    assert viewer_of(env, "nonsense", **kw) is None


def test_slurms_rule() -> None:
    vis = Visibility(
        private_jobs=True, admins=frozenset({"root", "op"}), coordinated={"prof": frozenset({"a"})}
    )
    assert may_see(vis, "u", "u", "x")
    assert not may_see(vis, "u", "v", "x")
    assert may_see(vis, "op", "v", "x")
    assert may_see(vis, "prof", "v", "a") and not may_see(vis, "prof", "v", "b")
    assert not may_see(vis, "prof", "v", None)
    assert may_see(Visibility(private_jobs=False, admins=frozenset()), "u", "v", "x")


def test_idle_spans_need_every_gpu_idle_and_break_on_unread_buckets() -> None:
    t = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    w = [10.0] * 6
    utils = [(0.0, 0.0), (0.0, 50.0), (0.5, None), (None, None), (0.0, 1.0), (0.0, 0.0)]
    assert idle_spans(t, w, utils, 1.0) == ((0.0, 10.0), (20.0, 30.0), (40.0, 60.0))
    assert idle_spans([], [], [], 1.0) == ()
