"""The install of each lab root, as the README's: the wheel, then ``python -m
slurm_gpu.precompile`` as root (``share/testlab/build``). An ordinary user's process then finds
every generated method of the records in the root-owned tables, on the root's own Python
(Debian's, newer than the test cluster's: its ``dataclasses`` may compile one source per
class rather than one per method)."""

from __future__ import annotations

import json

from labtools import PROJECT_BIN, Lab

PROBE = (
    "import json, sys, dataclasses\n"
    "import slurm_gpu.records as r, slurm_gpu.config, slurm_gpu.methodcache as m\n"
    "a = r.Tres(cpus=2)\n"
    "print(json.dumps({'python': sys.version.split()[0], 'counts': m.counts(),\n"
    "                  'eq': a == r.Tres(cpus=2)}))\n"
)


def test_an_ordinary_user_reads_the_tables_root_wrote(lab: Lab) -> None:
    got = json.loads(
        lab.run([f"{PROJECT_BIN}/python", "-c", PROBE], user="labuser1").stdout.splitlines()[-1]
    )
    hits, misses = got["counts"]
    assert misses == 0 and hits > 10, got
    assert got["eq"]
