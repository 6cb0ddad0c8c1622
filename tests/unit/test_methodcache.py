"""The generated dataclass methods taken from tables beside the byte code (``methodcache``).

Each check runs a fresh interpreter on this checkout's package (what a user's ``gpueff``
does), counting the generated methods found in a table and the ones compiled.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_gpu
from slurm_gpu import methodcache

REPO = Path(slurm_gpu.__file__).resolve().parents[1]

#: Imports the modules gpueff's running-job path imports, then prints the counts and a few
#: behaviours of the classes that would differ if the methods were wrong.
PROBE = """
import json, dataclasses
import slurm_gpu.records as r
import slurm_gpu.config
from slurm_gpu import methodcache
a = r.Tres(cpus=2, mem_bytes=10, gpus=1)
b = r.Tres(cpus=2, mem_bytes=10, gpus=1)
try:
    a.cpus = 3
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
hits, misses = methodcache.counts()
print(json.dumps({"hits": hits, "misses": misses, "eq": a == b, "hash": hash(a) == hash(b),
                  "repr": repr(a), "frozen": frozen}))
"""


def _copy_package(tmp: Path) -> Path:
    """A copy of the package (sources only) whose tables the test may write and spoil."""
    dest = tmp / "tree"
    shutil.copytree(
        REPO / "slurm_gpu", dest / "slurm_gpu", ignore=shutil.ignore_patterns("__pycache__")
    )
    return dest


def _python(tree: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """This interpreter on ``args`` with ``tree`` as the only package path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(tree)
    return subprocess.run(
        [sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, check=check
    )


def _run(tree: Path, code: str = PROBE) -> dict[str, object]:
    out = _python(tree, "-c", code)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _build(tree: Path) -> str:
    return _python(tree, "-m", "slurm_gpu.precompile").stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package with its tables written, once for the module's tests."""
    tree = _copy_package(tmp_path_factory.mktemp("built"))
    _build(tree)
    return tree


def _copy_built(built: Path, tmp: Path) -> Path:
    """A copy of ``built``, tables included, that one test may spoil."""
    dest = tmp / "tree"
    shutil.copytree(built, dest, symlinks=True)
    return dest


def _records_table(tree: Path) -> Path:
    return Path(methodcache.table_path(str(tree / "slurm_gpu" / "records.py")))


def test_without_tables_every_method_is_compiled(tmp_path: Path) -> None:
    got = _run(_copy_package(tmp_path))
    assert got["hits"] == 0 and int(str(got["misses"])) > 100
    assert got["eq"] and got["hash"] and got["frozen"]


def test_built_tables_answer_every_generated_method_and_the_classes_behave_the_same(
    tmp_path: Path,
) -> None:
    tree = _copy_package(tmp_path)
    before = _run(tree)
    said = _build(tree)
    assert said.endswith("modules kept\n") and "generated methods of" in said
    after = _run(tree)
    assert after["misses"] == 0 and int(str(after["hits"])) > 100
    assert after["hits"] == before["misses"]
    for key in ("eq", "hash", "repr", "frozen"):
        assert after[key] == before[key]
    mode = _records_table(tree).stat().st_mode & 0o777
    assert mode == 0o644


def test_a_changed_class_is_compiled_again_and_the_rest_still_found(
    built: Path, tmp_path: Path
) -> None:
    tree = _copy_built(built, tmp_path)
    whole = _run(tree)["hits"]
    records = tree / "slurm_gpu" / "records.py"
    text = records.read_text(encoding="utf-8")
    # One more field on Tres: its generated methods' source changes.
    marker = "class Tres:\n"
    assert marker in text
    head, tail = text.split(marker, 1)
    doc_end = tail.index('"""', tail.index('"""') + 3) + 3
    records.write_text(
        head + marker + tail[:doc_end] + "\n    spare_field_for_test: int = 0" + tail[doc_end:],
        encoding="utf-8",
    )
    got = _run(tree)
    assert 0 < int(str(got["misses"])) < 10
    assert int(str(got["hits"])) + int(str(got["misses"])) >= int(str(whole)) - 10


@pytest.mark.parametrize("spoil", ["garbage", "truncated", "other_magic", "group_writable", "link"])
def test_a_table_not_to_be_trusted_is_ignored(built: Path, tmp_path: Path, spoil: str) -> None:
    tree = _copy_built(built, tmp_path)
    table = _records_table(tree)
    data = table.read_bytes()
    if spoil == "garbage":
        table.write_bytes(b"\x00" * 64)
    elif spoil == "truncated":
        table.write_bytes(data[: len(data) // 2])
    elif spoil == "other_magic":
        head = len(b"slurm-gpu methods\n")
        table.write_bytes(data[:head] + b"\x00\x00\r\n" + data[head + 4 :])
    elif spoil == "group_writable":
        table.chmod(0o664)
    else:
        real = table.with_name("elsewhere")
        table.rename(real)
        table.symlink_to(real)
    got = _run(tree)
    # records.py's methods compiled, the other modules' tables still used.
    assert int(str(got["misses"])) > 20 and int(str(got["hits"])) > 0
    assert got["eq"] and got["frozen"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_a_table_owned_by_another_account_is_ignored(built: Path, tmp_path: Path) -> None:
    tree = _copy_built(built, tmp_path)
    os.chown(_records_table(tree), 65534, 65534)
    got = _run(tree)
    assert int(str(got["misses"])) > 20


def test_other_packages_dataclasses_are_not_looked_up(built: Path) -> None:
    tree = built
    code = (
        "import json, dataclasses, slurm_gpu\n"
        "from slurm_gpu import methodcache\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class Mine:\n"
        "    x: int\n"
        "print(json.dumps({'hits': methodcache.counts()[0], 'misses': methodcache.counts()[1],"
        " 'ok': Mine(1) == Mine(1)}))\n"
    )
    got = _run(tree, code)
    assert got == {"hits": 0, "misses": 0, "ok": True}


def test_precompile_refuses_a_pycache_others_can_write(tmp_path: Path) -> None:
    tree = _copy_package(tmp_path)
    cache = tree / "slurm_gpu" / "__pycache__"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    res = _python(tree, "-m", "slurm_gpu.precompile", check=False)
    assert res.returncode == 1
    assert "only this account can write" in res.stderr and "hint:" in res.stderr
    assert "Traceback" not in res.stderr
    assert not list(cache.glob("*.methods"))
