"""Spool format, sealed records, checkpoints, live summary (slurm_gpu.capture.spool)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import stat
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.capture.aggregate import NodeAggregator
from slurm_gpu.capture.recordcodec import to_jsonable
from slurm_gpu.capture.spool import (
    HOST_FIELDS,
    RECORD_SCHEMA,
    RECORD_VERSION,
    SAMPLE_FIELDS,
    JobSpool,
    SpoolHeader,
    SpoolWriter,
    decode_header,
    decode_reading,
    decode_record,
    encode_header,
    encode_reading,
    encode_reading_v1,
    encode_record,
    list_sealed,
    read_header,
    read_pidfile,
    read_record,
    read_spool,
    read_state,
    write_pidfile,
    write_record,
    write_state,
)
from slurm_gpu.errors import SpoolFormatError
from slurm_gpu.records import GpuInfo, GpuProcess, GpuSample, HostSample, TimelinePoint

INFO = (
    GpuInfo(uuid="GPU-a", index=0, minor_number=0, name="H100", compute_capability=(9, 0)),
    GpuInfo(uuid="MIG-b", parent_uuid="GPU-x", mig_profile="1g.10gb"),
)
HEADER = SpoolHeader(
    job_id="42",
    hostname="n1",
    uid=1000,
    interval_s=10.0,
    source="virtual",
    gpus=INFO,
    started_s=1000.0,
)
#: The same spool as written before version 2 (an object per GPU sample).
HEADER_V1 = dataclasses.replace(HEADER, version=1, sample_fields=(), host_fields=())
FULL = GpuSample(
    uuid="GPU-a",
    time_s=1010.0,
    utilization_pct=55.5,
    utilization_samples_pct=(50.0, 61.0),
    memory_utilization_pct=20.0,
    memory_used_bytes=123,
    memory_total_bytes=456,
    power_w=300.5,
    energy_mj=99,
    sm_clock_mhz=1980,
    memory_clock_mhz=2619,
    throttle_reasons=4,
    temperature_c=70.0,
    pcie_tx_bytes_per_s=1.5,
    pcie_rx_bytes_per_s=2.5,
    nvlink_tx_bytes=10,
    nvlink_rx_bytes=20,
    ecc_corrected_total=1,
    ecc_uncorrected_total=0,
    xid_events=(79,),
    processes=(GpuProcess(pid=7, used_memory_bytes=100), GpuProcess(pid=8)),
    sm_active_pct=40.0,
    sm_occupancy_pct=20.0,
    tensor_active_pct=10.0,
)
LOST = GpuSample(uuid="MIG-b", time_s=1010.0, available=False)
HOST = HostSample(
    time_s=1010.0,
    cpu_time_s=12.5,
    rss_bytes=2**30,
    io_read_bytes=5,
    io_write_bytes=6,
    process_count=3,
    method="proc",
)


def write_spool(path: Path, n: int, header: SpoolHeader = HEADER) -> None:
    w = SpoolWriter(str(path), header)
    for i in range(n):
        t = 1010.0 + 10 * i
        w.append(t, [FULL, LOST], HOST)
    w.close()


def test_header_roundtrip_and_sample_header_fields(tmp_path: Path) -> None:
    line = encode_header(HEADER)
    data = json.loads(line)
    assert data["schema"] == "slurm-gpu/spool" and data["version"] == 2
    assert {"job_id", "hostname", "uid", "interval_s", "source", "gpus", "started_s"} <= data.keys()
    # The field names are written once, here, in the order of every line's values.
    assert data["sample_fields"] == list(SAMPLE_FIELDS)
    assert "uuid" not in SAMPLE_FIELDS and "time_s" not in SAMPLE_FIELDS
    assert data["host_fields"] == list(HOST_FIELDS) and "time_s" not in HOST_FIELDS
    assert decode_header(line) == HEADER


def test_version_1_header_is_read_and_written_as_before() -> None:
    line = encode_header(HEADER_V1)
    data = json.loads(line)
    assert data["version"] == 1 and "sample_fields" not in data and "host_fields" not in data
    assert list(data) == [
        "schema", "version", "job_id", "hostname", "uid", "interval_s", "source", "gpus",
        "started_s",
    ]  # fmt: skip
    assert decode_header(line) == HEADER_V1


@pytest.mark.parametrize(
    "change",
    [
        {"version": 3},
        {"version": True},
        {"schema": "other"},
        {"version": None},
        {"gpus": "x"},
        {"sample_fields": "x"},
        {"sample_fields": [*SAMPLE_FIELDS, "future_field_pct"]},
        {"sample_fields": ["power_w", "power_w"]},
        {"host_fields": [1, 2]},
        {"host_fields": ["method"]},  # the others are required
    ],
)
def test_unknown_header_rejected(change: dict[str, object]) -> None:
    data = json.loads(encode_header(HEADER))
    data.update(change)
    with pytest.raises(SpoolFormatError):
        decode_header(json.dumps(data).encode())


def test_version_2_header_without_field_lists_rejected() -> None:
    data = json.loads(encode_header(HEADER))
    del data["sample_fields"]
    with pytest.raises(SpoolFormatError, match="sample_fields"):
        decode_header(json.dumps(data).encode())


@pytest.mark.parametrize("header", [HEADER, HEADER_V1], ids=["v2", "v1"])
def test_readings_roundtrip_and_file_mode(tmp_path: Path, header: SpoolHeader) -> None:
    path = tmp_path / "n1.jsonl"
    write_spool(path, 3, header)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    contents = read_spool(str(path))
    assert contents.header == header
    assert not contents.truncated
    assert len(contents.readings) == 3
    r = contents.readings[1]
    assert r.time_s == 1020.0
    assert r.gpus[0] == GpuSample(**{**_fields(FULL), "time_s": 1020.0})
    assert r.gpus[1] == GpuSample(uuid="MIG-b", time_s=1020.0, available=False)
    assert r.host == HostSample(**{**_fields(HOST), "time_s": 1020.0})


def _fields(obj: object) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__slots__}  # type: ignore[attr-defined]


@pytest.mark.parametrize("header", [HEADER, HEADER_V1], ids=["v2", "v1"])
@pytest.mark.parametrize("cut", [1, 25, 90])
def test_truncated_last_line_ignored(tmp_path: Path, header: SpoolHeader, cut: int) -> None:
    path = tmp_path / "n1.jsonl"
    write_spool(path, 4, header)
    data = path.read_bytes()
    path.write_bytes(data[:-cut])
    contents = read_spool(str(path))
    assert contents.truncated
    assert len(contents.readings) == 3


def test_appending_to_existing_file_keeps_one_header(tmp_path: Path) -> None:
    path = tmp_path / "n1.jsonl"
    write_spool(path, 2)
    write_spool(path, 2)
    assert len(read_spool(str(path)).readings) == 4


def test_writer_continues_a_version_1_spool_in_version_1(tmp_path: Path) -> None:
    """A sampler restarted after an upgrade appends to the file its predecessor began: one
    file never mixes versions."""
    path = tmp_path / "n1.jsonl"
    write_spool(path, 2, HEADER_V1)
    write_spool(path, 2, HEADER)
    contents = read_spool(str(path))
    assert contents.header == HEADER_V1 and not contents.truncated
    assert len(contents.readings) == 4
    assert contents.readings[3].gpus[0] == dataclasses.replace(FULL, time_s=1020.0)
    assert all(
        isinstance(json.loads(line)["g"][0], dict) for line in path.read_bytes().splitlines()[1:]
    )


def test_writer_continues_a_version_2_spool_in_its_field_order(tmp_path: Path) -> None:
    path = tmp_path / "n1.jsonl"
    other = dataclasses.replace(
        HEADER,
        sample_fields=tuple(reversed(SAMPLE_FIELDS))[:-1],  # without "available": its default
        host_fields=tuple(reversed(HOST_FIELDS)),
    )
    write_spool(path, 1, other)
    write_spool(path, 1, HEADER)
    contents = read_spool(str(path))
    assert contents.header == other and len(contents.readings) == 2
    for reading in contents.readings:
        assert reading.gpus[0] == dataclasses.replace(FULL, time_s=reading.time_s)
        assert reading.host == dataclasses.replace(HOST, time_s=reading.time_s)


def test_version_2_line_is_one_array_per_gpu_in_header_order() -> None:
    line = encode_reading(1010.0, [FULL, LOST], HOST)
    data = json.loads(line)
    assert list(data) == ["t", "g", "h"]
    full, lost = data["g"]
    expected = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in _fields(FULL).items()
        if k not in ("uuid", "time_s")
    }
    expected["processes"] = [[7, 100], [8, None]]
    assert dict(zip(SAMPLE_FIELDS, full, strict=True)) == expected
    assert dict(zip(SAMPLE_FIELDS, lost, strict=True)) == {
        n: False
        if n == "available"
        else []
        if n in ("utilization_samples_pct", "xid_events")
        else None
        for n in SAMPLE_FIELDS
    }
    assert data["h"] == [12.5, 2**30, 5, 6, 3, "proc"]
    # A third of the bytes of the same reading in version 1.
    assert len(line) * 2 < len(encode_reading_v1(1010.0, [FULL, LOST], HOST))
    assert "h" not in json.loads(encode_reading(1010.0, [LOST, LOST], None))


@pytest.mark.parametrize(
    "line",
    [
        b'{"t": 1.0, "g": [[true], []]}',  # too few values
        b'{"t": 1.0, "g": [{"available": true}, {"available": false}]}',  # version 1 objects
        b'{"t": 1.0, "g": [[], []], "h": {}}',
        b'{"t": "x", "g": [[], []]}',
    ],
)
def test_bad_version_2_lines_rejected(line: bytes) -> None:
    with pytest.raises(SpoolFormatError):
        decode_reading(line, HEADER)


def test_version_2_bad_process_pairs_rejected() -> None:
    data = json.loads(encode_reading(1010.0, [FULL, LOST], HOST))
    i = SAMPLE_FIELDS.index("processes")
    for bad in ([[7]], [7], [[7, "x"]], [["7", 1]]):
        data["g"][0][i] = bad
        with pytest.raises(SpoolFormatError):
            decode_reading(json.dumps(data).encode(), HEADER)


def test_empty_or_foreign_spool_rejected(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"")
    with pytest.raises(SpoolFormatError):
        read_header(str(path))
    path.write_bytes(b'{"hello": 1}\n')
    with pytest.raises(SpoolFormatError):
        read_spool(str(path))
    with pytest.raises(SpoolFormatError):
        read_header(str(tmp_path / "missing.jsonl"))


def make_record(complete: bool = True):  # type: ignore[no-untyped-def]
    agg = NodeAggregator(
        job_id="42",
        hostname="n1",
        uid=1000,
        interval_s=10.0,
        source="virtual",
        gpus=INFO,
        started_s=1000.0,
    )
    for i in range(5):
        agg.add(1010.0 + 10 * i, [FULL, LOST], HOST)
    return agg.record(ended_s=1100.0, complete=complete, notes=["gpu_lost:MIG-b"])


def test_record_roundtrip_atomic_and_private(tmp_path: Path) -> None:
    rec = make_record()
    path = tmp_path / "n1.record"
    write_record(str(path), rec)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_record(str(path)) == rec
    assert [p.name for p in tmp_path.iterdir()] == ["n1.record"]  # no temporary left


def test_record_unknown_version_or_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "n1.record"
    write_record(str(path), make_record())
    body = json.loads(path.read_bytes())
    body["version"] = 99
    path.write_text(json.dumps(body))
    with pytest.raises(SpoolFormatError, match="version 99"):
        read_record(str(path))
    body["version"] = 1
    del body["record"]["gpus"]
    path.write_text(json.dumps(body))
    with pytest.raises(SpoolFormatError, match="gpus"):
        read_record(str(path))
    path.write_text("{not json")
    with pytest.raises(SpoolFormatError):
        read_record(str(path))


def test_record_timeline_is_stored_as_columns() -> None:
    rec = make_record()
    assert len(rec.timeline) == 5
    body = json.loads(encode_record(rec))
    assert body["version"] == RECORD_VERSION == 2
    timeline = body["record"]["timeline"]
    assert timeline["t_s"] == [p.t_s for p in rec.timeline]
    # One list per GPU, in the order of the record's GPUs.
    assert timeline["gpu_utilization_pct"] == [
        [p.gpu_utilization_pct[g] for p in rec.timeline] for g in range(2)
    ]
    assert decode_record(encode_record(rec)) == rec


def test_version_1_records_are_still_read() -> None:
    rec = make_record()
    v1 = {"schema": RECORD_SCHEMA, "version": 1, "record": to_jsonable(rec)}
    assert isinstance(v1["record"]["timeline"], list)
    assert decode_record(json.dumps(v1).encode()) == rec


def test_ragged_timeline_keeps_the_row_form() -> None:
    rec = make_record()
    odd = TimelinePoint(2000.0, 10.0, 1, (1.0,), (None,), (None,), None, None)
    ragged = dataclasses.replace(rec, timeline=(*rec.timeline, odd))
    data = encode_record(ragged)
    assert isinstance(json.loads(data)["record"]["timeline"], list)
    assert decode_record(data) == ragged


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("samples", lambda n: [1.5] * n, "timeline.samples: expected an integer"),
        ("t_s", lambda n: ["x"] * n, "timeline.t_s: expected a number"),
        ("width_s", lambda n: [10.0] * (n + 1), "timeline.width_s: expected 5 values"),
        ("gpu_power_w", lambda n: [[1.0] * n], "timeline.gpu_power_w: expected 2"),
        ("gpu_memory_used_max_bytes", lambda n: [[True] * n] * 2, "expected an integer"),
        ("host_rss_max_bytes", lambda n: None, "host_rss_max_bytes: expected a list"),
        ("bogus", lambda n: [], "unknown field 'bogus'"),
    ],
)
def test_columnar_timeline_is_checked_strictly(column: str, value: Any, message: str) -> None:
    body = json.loads(encode_record(make_record()))
    body["record"]["timeline"][column] = value(5)
    with pytest.raises(SpoolFormatError, match=message):
        decode_record(json.dumps(body).encode())
    body = json.loads(encode_record(make_record()))
    del body["record"]["timeline"]["samples"]
    with pytest.raises(SpoolFormatError, match="samples"):
        decode_record(json.dumps(body).encode())


def test_list_sealed(tmp_path: Path) -> None:
    for job in ("100", "9"):
        paths = JobSpool(str(tmp_path), job, "n1")
        paths.create_dir()
        write_record(paths.record, make_record())
    JobSpool(str(tmp_path), "55", "n1").create_dir()  # running: no record yet
    (tmp_path / "owners").mkdir()
    (tmp_path / "notajob").mkdir()
    found = list_sealed(str(tmp_path))
    assert [(r.job_id, r.hostname) for r in found] == [("9", "n1"), ("100", "n1")]
    assert list_sealed(str(tmp_path / "nope")) == []


def test_job_dir_mode(tmp_path: Path) -> None:
    """The spool root and job directories are root's alone (0700); a root left 0711 by an
    earlier release is tightened. Users read their live summary from the live directory."""
    (tmp_path / "spool").mkdir(mode=0o711)
    os.chmod(tmp_path / "spool", 0o711)
    paths = JobSpool(str(tmp_path / "spool"), "42", "n1")
    paths.create_dir()
    assert stat.S_IMODE(os.stat(paths.job_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(paths.spool_dir).st_mode) == 0o700
    assert paths.live == str(tmp_path / "spool-live" / "42" / "n1.json")


@pytest.mark.parametrize("job_id", ["../1", "1/2", "", "12a", "1 2"])
def test_unsafe_job_ids_rejected(job_id: str) -> None:
    with pytest.raises(SpoolFormatError):
        JobSpool("/tmp", job_id, "n1")


def test_unsafe_hostname_rejected() -> None:
    with pytest.raises(SpoolFormatError):
        JobSpool("/tmp", "1", "../etc")


def test_state_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "n1.state"
    write_state(str(path), {"a": [1, 2]}, 1234, ["x"])
    assert read_state(str(path)) == ({"a": [1, 2]}, 1234, ["x"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text('{"schema": "slurm-gpu/sampler-state", "version": 7}')
    with pytest.raises(SpoolFormatError):
        read_state(str(path))


def test_pidfile_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "n1.pid"
    write_pidfile(str(path), os.getpid())
    pid, start = read_pidfile(str(path)) or (0, None)
    assert pid == os.getpid() and start is not None
    path.write_text("garbage")
    assert read_pidfile(str(path)) is None
    assert read_pidfile(str(tmp_path / "none.pid")) is None


def test_timeline_points_built_without_the_constructor_equal_constructed_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu.capture import recordcodec

    assert recordcodec._FAST_BUILD  # the fast path is the one exercised by the tests above
    data = encode_record(make_record())
    fast = decode_record(data)
    monkeypatch.setattr(recordcodec, "_FAST_BUILD", False)
    slow = decode_record(data)
    assert fast == slow and fast.timeline == slow.timeline
    assert [type(p) for p in fast.timeline] == [TimelinePoint] * len(slow.timeline)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.timeline[0].t_s = 0.0  # type: ignore[misc]
    assert hash(fast.timeline[0]) == hash(slow.timeline[0])


def _reference_line_v1(time_s: float, gpus: list[GpuSample], host: HostSample | None) -> bytes:
    """A version 1 spool line as the format defines it: every sample field but uuid and time
    that is not at its default, processes as objects, compact JSON."""
    g = []
    for s in gpus:
        d: dict[str, Any] = {}
        for f in dataclasses.fields(GpuSample):
            value = getattr(s, f.name)
            if f.name in ("uuid", "time_s") or value == f.default:
                continue
            if f.name == "processes":
                value = [
                    {k: v for k, v in dataclasses.asdict(p).items() if v is not None} for p in value
                ]
            d[f.name] = list(value) if isinstance(value, tuple) else value
        g.append(d)
    body: dict[str, Any] = {"t": time_s, "g": g}
    if host is not None:
        body["h"] = {k: v for k, v in dataclasses.asdict(host).items() if k != "time_s"}
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


def _reference_line_v2(time_s: float, gpus: list[GpuSample], host: HostSample | None) -> bytes:
    """A version 2 spool line as the format defines it: per GPU the values of every sample
    field but uuid and time, in field order, processes as [pid, used_memory_bytes] pairs;
    the host's values but time; compact JSON."""
    g = []
    for s in gpus:
        row: list[Any] = []
        for f in dataclasses.fields(GpuSample):
            value = getattr(s, f.name)
            if f.name in ("uuid", "time_s"):
                continue
            if f.name == "processes" and value is not None:
                value = [[p.pid, p.used_memory_bytes] for p in value]
            row.append(list(value) if isinstance(value, tuple) else value)
        g.append(row)
    body: dict[str, Any] = {"t": time_s, "g": g}
    if host is not None:
        body["h"] = [v for k, v in dataclasses.asdict(host).items() if k != "time_s"]
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


@pytest.mark.parametrize(
    ("version", "encode", "reference"),
    [(2, encode_reading, _reference_line_v2), (1, encode_reading_v1, _reference_line_v1)],
    ids=["v2", "v1"],
)
def test_reading_lines_are_the_format_byte_for_byte(
    version: int, encode: Any, reference: Any
) -> None:
    rng = random.Random(20261121)
    floats = [0.0, -0.0, 1e-7, 1e20, 100.0, 33.3, math.nan, math.inf, -math.inf]

    def value(f: dataclasses.Field[Any]) -> Any:
        if rng.random() < 0.3:
            return f.default
        if f.name == "available":
            return rng.random() < 0.5
        if f.name == "processes":
            return tuple(
                GpuProcess(pid=rng.randrange(1, 99999), used_memory_bytes=rng.choice([None, 0, 7]))
                for _ in range(rng.randrange(0, 3))
            )
        if f.name == "utilization_samples_pct":
            return tuple(rng.choice(floats) for _ in range(rng.randrange(0, 4)))
        if f.name == "xid_events":
            return tuple(rng.randrange(100) for _ in range(rng.randrange(0, 3)))
        if "float" in str(f.type):
            return rng.choice([*floats, rng.random() * 1000])
        return rng.choice([0, 1, 2**63, rng.randrange(10**15)])

    fields = [f for f in dataclasses.fields(GpuSample) if f.name not in ("uuid", "time_s")]
    header = SpoolHeader(
        job_id="1", hostname="n1", uid=None, interval_s=1.0, source="virtual",
        gpus=tuple(GpuInfo(uuid=f"GPU-{i}") for i in range(4)), started_s=0.0,
    )  # fmt: skip
    if version == 1:
        header = dataclasses.replace(header, version=1, sample_fields=(), host_fields=())
    for _ in range(2000):
        gpus = [
            GpuSample(uuid=f"GPU-{i}", time_s=1.0, **{f.name: value(f) for f in fields})
            for i in range(4)
        ]
        host = rng.choice([None, HostSample(1.0, 2.5, 4096, None, 7, 3, 'pr\u00f6c"')])
        t = rng.choice([1763719210.0, rng.random() * 2e9])
        line = encode(t, gpus, host)
        assert line == reference(t, gpus, host)
        # Decoding gives back the same samples (compared through their encoding: NaN).
        reading = decode_reading(line, header)
        assert [s.uuid for s in reading.gpus] == [s.uuid for s in gpus]
        assert encode(reading.time_s, reading.gpus, reading.host) == line
        assert reading.host == (None if host is None else dataclasses.replace(host, time_s=t))


@pytest.mark.parametrize("header", [HEADER, HEADER_V1], ids=["v2", "v1"])
def test_epilog_recovers_a_spool_of_either_version(tmp_path: Path, header: SpoolHeader) -> None:
    """A sampler killed before its first checkpoint: the epilog folds the whole spool, also
    one begun before an upgrade (version 1)."""
    from slurm_gpu.config import Settings
    from slurm_gpu.hooks.epilog import recover_record

    paths = JobSpool(str(tmp_path / "spool"), "42", "n1")
    paths.create_dir()
    write_spool(Path(paths.jsonl), 4, header)
    with open(paths.jsonl, "ab") as fh:
        fh.write(encode_reading(1100.0, [FULL, LOST], HOST)[:30])  # torn by the kill
    assert "4 from the spool tail" in recover_record(paths, Settings(), "sampler_not_running")
    record = read_record(paths.record)
    assert not record.complete and "spool_truncated" in record.notes
    assert [g.samples for g in record.gpus] == [4, 4]
    assert record.gpus[0].samples_available == 4 and record.gpus[1].samples_available == 0
    assert record.gpus[0].pids == (7, 8) and record.host is not None
