"""Typed, immutable records shared by every layer.

Units are part of every field name (``_bytes``, ``_w``, ``_s``, ``_pct``, ``_mj``). ``None`` always
means "not reported by this source or this GPU", never zero. Times are Unix epoch seconds
(float) unless a name says otherwise. GPUs are identified by UUID (``GPU-…``, or ``MIG-…`` for
a MIG instance), never by ordinal: ordinals differ between gres.conf, CUDA_VISIBLE_DEVICES and
NVML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --------------------------------------------------------------------------- GPU telemetry


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What does not change while a job runs: identity and capacity of one GPU or MIG slice."""

    uuid: str
    """``GPU-…`` or ``MIG-…``."""
    index: int | None = None
    """The source's own ordinal (NVML index). Informational only: never used to match."""
    minor_number: int | None = None
    """N of ``/dev/nvidiaN``; what gres.conf ``File=`` lines name, so it maps Slurm's GPU
    indices to devices."""
    name: str | None = None
    """Product name, e.g. ``NVIDIA H100 80GB HBM3``."""
    memory_total_bytes: int | None = None
    power_limit_w: float | None = None
    """Enforced power limit in watts."""
    parent_uuid: str | None = None
    """For a MIG instance, the UUID of the physical GPU; ``None`` for a whole GPU."""
    mig_profile: str | None = None
    """MIG profile name such as ``1g.10gb``; ``None`` for a whole GPU."""
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    """(major, minor); tensor cores exist from 7.0."""
    gpu_instance_id: int | None = None
    """For a MIG instance, NVML's GPU instance id (the ``<gi>`` of Slurm's
    ``MIG-GPU-<parent uuid>/<gi>/<ci>``); ``None`` for a whole GPU or when not known."""
    compute_instance_id: int | None = None
    """For a MIG instance, NVML's compute instance id (the ``<ci>``)."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process seen on a GPU."""

    pid: int
    used_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU.

    ``available=False`` means the GPU could not be read at all at this time (lost, fallen off
    the bus, or its virtual file vanished); every metric is then ``None``.
    """

    uuid: str
    time_s: float
    available: bool = True
    utilization_pct: float | None = None
    """Duty cycle: percent of the driver's last sample period during which any kernel ran.
    Not how busy the SMs were (see ``sm_active_pct``)."""
    utilization_samples_pct: tuple[float, ...] = ()
    """The driver's buffered sub-interval utilization samples since the previous reading
    (``nvmlDeviceGetSamples``), oldest first; empty when not supported. NVML reads them at
    the cumulative counters' cadence only, over the interval before that reading: empty at
    the readings between (virtual GPUs give them at every reading)."""
    memory_utilization_pct: float | None = None
    """Percent of time the memory controller was busy."""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    energy_mj: int | None = None
    """Total energy counter since the driver loaded, millijoules (monotonic)."""
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    throttle_reasons: int | None = None
    """NVML clock-event-reason bitmask (see ``slurm_gpu.telemetry.base.THROTTLE_*``)."""
    temperature_c: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes: int | None = None
    """Cumulative NVLink bytes sent, summed over links; ``None`` without NVLink."""
    nvlink_rx_bytes: int | None = None
    ecc_corrected_total: int | None = None
    """Volatile (since driver load) corrected ECC error count."""
    ecc_uncorrected_total: int | None = None
    xid_events: tuple[int, ...] = ()
    """XID codes reported since the previous reading."""
    processes: tuple[GpuProcess, ...] | None = None
    """Compute processes on the GPU; ``None`` when the list could not be read."""
    sm_active_pct: float | None = None
    """Share of SM cycles with at least one warp resident (GPM/DCGM SM activity)."""
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    """Share of cycles the tensor cores were busy (GPM), where the GPU reports it."""
    # Last, after every field the virtual source fills by position.
    violation_power_ns: int | None = None
    """Cumulative time the power policy held the clocks down, nanoseconds since the driver
    loaded (``nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER)``); ``None`` when the
    driver does not keep it. Exact where the bitmask is one sample per interval."""
    violation_thermal_ns: int | None = None
    """The same for the thermal policy (``NVML_PERF_POLICY_THERMAL``), nanoseconds."""


# --------------------------------------------------------------------------- job host


@dataclass(frozen=True, slots=True)
class HostSample:
    """One reading of the job's processes on this node (all counters cumulative)."""

    time_s: float
    cpu_time_s: float | None
    """User + system CPU time of the job on this node since it started, seconds."""
    rss_bytes: int | None
    """Resident memory of the job on this node now (cgroup ``memory.current`` minus file cache
    where the cgroup reports it, else the sum of RSS)."""
    io_read_bytes: int | None
    io_write_bytes: int | None
    process_count: int | None
    method: str
    """How it was read: ``cgroup2``, ``cgroup1``, ``proc`` or ``none``."""


# --------------------------------------------------------------------------- summaries


@dataclass(frozen=True, slots=True)
class Distribution:
    """A streaming distribution of percentages in 1 %-wide bins (0–100).

    ``counts[i]`` counts values v with ``i <= v < i+1`` (100 goes into bin 100); the
    percentiles derived from it are exact to 1 percentage point whatever the job length.
    """

    counts: tuple[int, ...]
    total: float
    """Sum of all values, for an exact mean."""

    @property
    def n(self) -> int:
        return sum(self.counts)

    @property
    def mean(self) -> float | None:
        n = self.n
        return self.total / n if n else None

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0–100), lower edge of the bin it falls in; ``None`` if empty."""
        n = self.n
        if not n:
            return None
        rank = q / 100.0 * (n - 1)
        seen = 0
        for value, count in enumerate(self.counts):
            seen += count
            if seen > rank:
                return float(value)
        return float(len(self.counts) - 1)


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """One bucket of the downsampled timeline: means and peaks over ``[t_s, t_s + width_s)``.

    Per-GPU tuples follow the order of ``NodeRecord.gpus``; ``None`` where no value was read.
    """

    t_s: float
    width_s: float
    samples: int
    gpu_utilization_pct: tuple[float | None, ...]
    gpu_memory_used_max_bytes: tuple[int | None, ...]
    gpu_power_w: tuple[float | None, ...]
    host_cpu_cores: float | None
    """Mean number of cores busy (CPU-seconds per second)."""
    host_rss_max_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """Everything the analysis needs about one GPU over one job on one node, in O(1) size."""

    info: GpuInfo
    samples: int
    """Readings attempted."""
    samples_available: int
    """Readings where the GPU answered."""
    first_time_s: float | None
    last_time_s: float | None
    utilization: Distribution
    """Per-reading duty cycle."""
    sub_samples: Distribution
    """The driver's sub-interval samples, where supported (n == 0 otherwise)."""
    idle_samples: int
    """Readings with duty cycle at or below the idle threshold the sampler was given."""
    active_first_time_s: float | None
    """Time of the first reading above the idle threshold; ``None`` if never active."""
    active_last_time_s: float | None
    memory_used_max_bytes: int | None
    memory_used_mean_bytes: float | None
    power_mean_w: float | None
    power_max_w: float | None
    energy_j: float | None
    """From the energy counter where present, else the integral of power; joules."""
    sm_clock_mean_mhz: float | None
    temperature_max_c: float | None
    throttle_power_s: float
    """Seconds during which the power policy held the clocks down: from the driver's
    cumulative violation counter where it keeps one, else the readings' bitmask (a reading
    standing for its interval). Counted only over ``throttle_power_known_s``."""
    throttle_thermal_s: float
    """Seconds during which a thermal (hardware or software) slowdown held the clocks down,
    counted the same way over ``throttle_thermal_known_s``."""
    pcie_tx_mean_bytes_per_s: float | None
    pcie_rx_mean_bytes_per_s: float | None
    nvlink_bytes: int | None
    """NVLink bytes (tx + rx) moved during the job; ``None`` without NVLink."""
    nvlink_bytes_while_idle: int | None
    """NVLink bytes moved during readings where the GPU was idle (communication waits)."""
    ecc_corrected: int | None
    """Corrected ECC errors that appeared during the job."""
    ecc_uncorrected: int | None
    xid_events: tuple[int, ...]
    """Distinct XID codes seen during the job."""
    process_seen: bool
    """Whether any compute process ever appeared on this GPU."""
    max_processes: int
    pids: tuple[int, ...]
    """Up to 16 distinct compute pids seen, first first."""
    sm_active_mean_pct: float | None
    tensor_active_mean_pct: float | None
    process_list_unread: int | None = None
    """Answered readings at which the compute-process list could not be read (the source gave
    ``None``, not an empty list); ``None`` in records sealed before it was counted."""
    throttle_power_known_s: float | None = None
    """Seconds over which power throttling was known (a violation counter delta or a
    bitmask): the denominator of ``throttle_power_s``. 0: never known (the driver gave no
    reasons), so the share is unknown, not 0 %. ``None`` in records sealed before it was
    counted and in store rows: read as known over the whole observed span, the denominator
    those records were analysed with (their readings came from virtual GPUs or from drivers
    that report reasons at every reading), so that re-reading them changes no result."""
    throttle_thermal_known_s: float | None = None
    """The same for thermal throttling."""
    stall_grid: tuple[int, ...] = ()
    """Readings counted by (duty cycle, host cores busy) at sampling resolution: index
    ``duty_bin * STALL_CPU_BINS + cpu_bin``, duty in 10 %-wide bins (0–10, 100 in the last)
    and the job's cores busy on this node as percent of its allocated cores in 5 %-wide bins
    (0–20, 100 and above in the last). Only readings where both were known; empty in records
    sealed before it was counted, or when the allocated cores were unknown."""
    memory_utilization_mean_pct: float | None = None
    """Mean percent of time the memory controller was reading or writing device memory (NVML's
    memory utilization, dcgm-exporter's ``DCGM_FI_DEV_MEM_COPY_UTIL``), over the readings
    that had it: the memory-bandwidth side of a busy-but-nearly-empty GPU. ``None`` when never
    reported, and in records sealed before it was counted."""

    def throttle_pct(self, observed_s: float | None) -> tuple[float | None, float | None]:
        """(power, thermal): throttled seconds over the seconds each was known, percent (at
        most 100); ``None`` where never known, which is unknown, not 0 %. Records without the
        known time are read over ``observed_s`` (the record's span), as they were analysed."""
        return (
            _share_pct(self.throttle_power_s, self.throttle_power_known_s, observed_s),
            _share_pct(self.throttle_thermal_s, self.throttle_thermal_known_s, observed_s),
        )

    @property
    def process_state(self) -> bool | None:
        """Whether a compute process ran on this GPU: ``True`` seen, ``False`` none (the list
        was read at every answered reading and was always empty), ``None`` unknown (the list
        could not always be read). Records without ``process_list_unread`` infer it: a GPU that
        ran kernels with no process seen had an unreadable list (a kernel needs a process)."""
        if self.process_seen:
            return True
        if self.process_list_unread is None:
            mean = self.utilization.mean
            return None if mean is not None and mean > 1.0 else False
        return False if self.process_list_unread == 0 else None


def _share_pct(part_s: float, known_s: float | None, observed_s: float | None) -> float | None:
    whole = observed_s if known_s is None else known_s
    if not whole or whole <= 0:
        return None
    return min(100.0, 100.0 * part_s / whole)


#: Bins of ``GpuSummary.stall_grid``: duty cycle in 10 % steps, cores busy in 5 % steps.
STALL_DUTY_BINS = 11
STALL_CPU_BINS = 21
STALL_DUTY_STEP_PCT = 10.0
STALL_CPU_STEP_PCT = 5.0


def stall_bin(duty_pct: float, cpu_busy_pct: float) -> int:
    """The ``stall_grid`` index of one reading (values outside 0–100 clamp to the edges)."""
    d = min(max(int(duty_pct // STALL_DUTY_STEP_PCT), 0), STALL_DUTY_BINS - 1)
    c = min(max(int(cpu_busy_pct // STALL_CPU_STEP_PCT), 0), STALL_CPU_BINS - 1)
    return d * STALL_CPU_BINS + c


@dataclass(frozen=True, slots=True)
class HostSummary:
    """The job's CPU, memory and I/O on one node."""

    method: str
    samples: int
    cpu_time_s: float | None
    """CPU time used on this node over the sampled span, seconds."""
    cpu_cores_busy: Distribution
    """Per-reading cores busy, as percent of the node's allocated cores (0–100); n == 0 when
    the allocated core count was unknown."""
    allocated_cores: int | None
    rss_max_bytes: int | None
    rss_mean_bytes: float | None
    io_read_bytes: int | None
    io_write_bytes: int | None


@dataclass(frozen=True, slots=True)
class StackProcess:
    """One main process of the job on this node (a rank), by its stack samples."""

    pid: int
    samples: int
    """Main-thread samples classified."""
    counts: tuple[int, ...]
    """Samples per class, in ``StackSummary.classes`` order."""


@dataclass(frozen=True, slots=True)
class StackSummary:
    """What the job's Python processes on this node were doing, from stack samples taken in
    short bursts (``docs/stacks.md``): class counts and deciding function names only, never a
    stack, an argument or a variable."""

    classes: tuple[str, ...]
    """Class names (the class table's, ``other`` last)."""
    counts: tuple[int, ...]
    """Main-thread samples of the job's main processes per class (``classes`` order)."""
    idle_counts: tuple[int, ...]
    """The same, counting only samples taken while every GPU of the node read idle at the
    sampler's last reading."""
    deciding: tuple[tuple[str, ...], ...]
    """Per class, up to three deciding frames (``dataloader.__next__``), most frequent first;
    cleaned user text."""
    interval_s: float
    """Configured seconds between the starts of two bursts."""
    bursts: int
    """Bursts that read at least one process."""
    bursts_failed: int
    """Bursts attempted that read none (no Python process, the reader refused or failed)."""
    first_s: float | None
    """Start of the first burst that read something, unix seconds."""
    last_s: float | None
    """End of the last burst that read something, unix seconds."""
    processes: tuple[StackProcess, ...] = ()
    """Per main process (rank), lowest pid first, at most 16."""
    worker_samples: int = 0
    """Samples of worker processes (DataLoader workers, pools), not in ``counts``."""
    reader_cpu_s: float = 0.0
    """CPU seconds the reader used over the job."""
    notes: tuple[str, ...] = ()
    """Why samples are missing (``no_cgroup``, ``reader_missing``, ``permission_denied``)."""

    @property
    def samples(self) -> int:
        """Main-thread samples classified."""
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """The sealed per-node record of one job: what the epilog leaves for the collector."""

    job_id: str
    """Slurm's raw job id (``JobIDRaw``: array tasks and het components have their own)."""
    hostname: str
    uid: int | None
    interval_s: float
    source: str
    """Telemetry backend: ``nvml`` or ``virtual``."""
    started_s: float
    ended_s: float
    gpus: tuple[GpuSummary, ...]
    host: HostSummary | None
    timeline: tuple[TimelinePoint, ...]
    complete: bool
    """True when the sampler sealed the record itself at SIGTERM; False when the epilog
    recovered it from the last checkpoint and the spool tail (sampler killed or crashed)."""
    notes: tuple[str, ...] = field(default=())
    """Short machine-readable notes (``sampler_killed``, ``gpu_lost:GPU-…``)."""
    stacks: StackSummary | None = None
    """Stack sampling's class shares (``docs/stacks.md``); ``None`` where it was off, and in
    records sealed before it existed."""


# --------------------------------------------------------------------------- Slurm accounting


@dataclass(frozen=True, slots=True)
class Tres:
    """A trackable-resource list (``cpu=8,mem=64G,node=1,billing=8,gres/gpu=2``), parsed.

    ``gpu_types`` maps a typed GPU name (``a100``) to its count when Slurm reported typed
    ``gres/gpu:a100=N``; ``gpus`` is the total whatever the type.
    """

    cpus: int | None = None
    mem_bytes: int | None = None
    nodes: int | None = None
    gpus: int | None = None
    gpu_types: tuple[tuple[str, int], ...] = ()
    billing: int | None = None
    raw: str = ""


@dataclass(frozen=True, slots=True)
class JobStep:
    """One step of a job (``srun``, the batch script, the extern step) as accounting knows it.

    Only fields no user can type: a step's name is user text and is not kept here.
    """

    step_id: str
    """The part of ``JobIDRaw`` after the dot: ``0``, ``12``, ``batch``, ``extern``, ``0+1``."""
    cpus: int | None
    """CPUs allocated to the step (its ``AllocCPUS``): what its tasks were bound to."""
    gpus: int | None
    """GPUs allocated to the step (``gres/gpu`` of its AllocTRES); ``None`` when not given."""
    nodes: int | None
    state: str
    """Base state, as ``JobRecord.state``."""
    exit_code: int | None
    exit_signal: int | None
    elapsed_s: int
    total_cpu_s: float | None
    """The step's TotalCPU (user + system), seconds."""
    tasks: int | None = None
    """The step's task count (``NTasks``): ranks, each usually one process on the node."""
    end_s: float | None = None
    """When the step ended, epoch seconds; ``None`` when accounting did not say."""
    cancelled_by_uid: int | None = None
    """The uid of ``CANCELLED by <uid>`` (who cancelled the step), else ``None``."""

    @property
    def is_task(self) -> bool:
        """A step the user started (``srun``, numbered): not ``batch``, ``extern``, …"""
        return self.step_id[:1].isdigit()

    @property
    def failed(self) -> bool:
        """It ended in a failure state or with a non-zero exit code or a signal."""
        if self.state in STEP_FAILED_STATES:
            return True
        return bool(self.exit_code) or bool(self.exit_signal)


#: Step states that are a failure whatever the exit code says.
STEP_FAILED_STATES = frozenset({"FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT"})


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One Slurm job (or array task, or het component) as accounting knows it.

    Slurm's CamelCase names stay inside the accounting adapters; this record is what every
    layer above them sees. Step data (MaxRSS, TotalCPU) is already folded into the job;
    ``steps`` keeps each step's own allocation, outcome and CPU time.
    """

    job_id: str
    """``JobIDRaw``: a plain integer string, unique per array task and het component."""
    job_id_display: str
    """``JobID`` as users type it: ``1234``, ``1234_7``, ``1234+0``."""
    array_job_id: str | None
    array_task_id: str | None
    het_job_id: str | None
    het_job_offset: int | None
    user: str
    uid: int | None
    account: str | None
    partition: str | None
    qos: str | None
    job_name: str
    work_dir: str | None
    nodelist: tuple[str, ...]
    """Expanded host names."""
    state: str
    """Base state without the ``by UID`` tail: COMPLETED, FAILED, TIMEOUT, CANCELLED,
    OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, RUNNING, PENDING, REQUEUED, …"""
    cancelled_by_uid: int | None
    exit_code: int | None
    exit_signal: int | None
    derived_exit_code: int | None
    alloc_tres: Tres
    req_tres: Tres
    alloc_cpus: int | None
    req_mem_bytes: int | None
    """Total requested memory for the job (per-CPU and per-node requests already multiplied
    out), bytes; ``None`` when unlimited or unknown."""
    max_rss_bytes: int | None
    """Largest MaxRSS over the job's steps, bytes."""
    total_cpu_s: float | None
    """TotalCPU (user + system) over all steps, seconds."""
    elapsed_s: int
    time_limit_s: int | None
    """``None`` when UNLIMITED or Partition_Limit could not be resolved."""
    submit_s: float | None
    start_s: float | None
    end_s: float | None
    restarts: int
    comment: str | None
    admin_comment: str | None
    mail_user: str | None
    mail_type: str | None
    gres_gpu_detail: str | None = None
    """Raw GPU index detail where sacct offers it; informational."""
    steps: tuple[JobStep, ...] = ()
    """The steps of the run described (the last run of a requeued job), in accounting order;
    empty where accounting gave none (``--allocations``, old stored jobs)."""
    reason: str | None = None
    """Slurm's last state reason of the job (``Reason``: ``NodeDown``, ``TimeLimit``, …), a
    fixed word no user can type; ``None`` when accounting did not say (not stored)."""
    submit_line: str | None = None
    """The command line the job was submitted with (``SubmitLine``, user text, cleaned), from
    which the request's style is read (``analysis.request``); ``None`` where accounting did
    not keep it."""
    batch_directives: str | None = None
    """The ``#SBATCH`` lines of the job's batch script, one a line (user text, cleaned and
    bounded: ``accounting.batchscript``), read as sbatch reads them; the submit line's options
    override them. ``None`` where the site keeps no scripts or the job had none."""


# --- Running jobs: what a node's live summaries (and Prometheus, from them) hold ---------


@dataclass(frozen=True, slots=True)
class LiveGpu:
    """One GPU of a running job, as its sampler last saw it."""

    uuid: str
    available: bool
    utilization_pct: float | None
    """Duty cycle at the last reading, percent."""
    utilization_recent_pct: float | None
    """Mean duty cycle over the last ``recent_window_s``, percent."""
    utilization_mean_pct: float | None
    """Mean duty cycle since the job started, percent."""
    recent_window_s: float | None
    busy_s: float | None
    """Seconds of kernel activity since the job started (a counter)."""
    sampled_s: float | None
    """Seconds covered by readings since the job started (a counter)."""
    idle_since_s: float | None
    """Start of the current idle run, unix seconds; ``None`` while busy."""
    active_first_s: float | None
    """First reading above the idle threshold, unix seconds; ``None``: never used."""
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    memory_used_max_bytes: int | None
    power_w: float | None
    energy_j: float | None
    """Energy used since the job started, joules (a counter)."""
    gpu_index: int | None = None
    """The number Slurm names the GPU by on its node (``SLURM_JOB_GPUS``, and ``scontrol -d
    show job``'s ``IDX`` where gres.conf lists ``/dev/nvidia0..N-1``): its minor number, or
    the telemetry source's index where the source knows none; ``None``: not known (a MIG
    slice)."""


@dataclass(frozen=True, slots=True)
class LiveJob:
    """One job on one host: its labels, host figures and GPUs."""

    job_id: str
    host: str
    user: str
    account: str
    partition: str
    uid: int | None
    started_s: float
    updated_s: float
    """Time of the last reading, unix seconds."""
    interval_s: float
    cpu_time_s: float | None
    """CPU seconds of the job on this host since it started (a counter)."""
    rss_bytes: int | None
    allocated_cores: int | None
    gpus: tuple[LiveGpu, ...]


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Every fresh live summary on this node, and how many were left out and why."""

    jobs: tuple[LiveJob, ...]
    stale: int
    """Summaries older than the staleness bound (a sampler that stopped writing)."""
    unreadable: int
    """Summaries that could not be read or parsed."""


# --- The live policy's evidence: each GPU over the policy's window --------------------------


@dataclass(frozen=True, slots=True)
class GpuWindow:
    """One GPU of a running job over the live policy's window, as the reader (Prometheus, or
    this node's live summary) holds it. ``None`` is a signal that is missing: the policy does
    not judge a job with a missing signal."""

    uuid: str
    util_max_pct: float | None
    """Highest duty cycle in the window at the reader's resolution (Prometheus: every scrape
    of ``slurm_gpu_gpu_utilization_ratio``), percent."""
    util_points: int
    """Samples of the utilisation series in the window (0: none)."""
    busy_growth_s: float | None
    """Growth of the busy-seconds counter over ``window_s``, seconds."""
    sampled_growth_s: float | None
    """Growth of the sampled-seconds counter over ``window_s``, seconds."""
    window_s: float
    """The window the two counters' growth covers, seconds."""
    counter_reset: bool
    """The counters went back in the window (a sampler restarted): growths are not usable."""
    ever_used: bool | None
    """A kernel ran on it since the job started (``first_active`` present)."""
    busy_s: float | None
    """Busy seconds since the job started (the counter's value)."""
    sampled_s: float | None
    """Sampled seconds since the job started (the counter's value)."""
    seen_age_s: float | None
    """Seconds since the reader last recorded this GPU's utilisation, by the reader's own
    clock (Prometheus: ``timestamp()``, its scrape time), never the node's."""
    gpu_index: tuple[str, ...] = ()
    """The ``gpu_index`` label values its series carry now (``LiveGpu.gpu_index``; ``""``: a
    series without it): one number for a GPU bound to Slurm's allocation; none, several or
    an unreadable one make its job a ``mismatch``."""


@dataclass(frozen=True, slots=True)
class PartWindow:
    """One job on one host, with where its series came from and how fresh they are."""

    job_id: str
    host: str
    """The ``host`` label (the node's own name for itself)."""
    user: str
    account: str
    targets: tuple[str, ...]
    """The hosts of the scrape targets the series came from (the target label Prometheus set,
    port and domain removed); more than one: the same job and host came from two targets."""
    scrape_jobs: tuple[str, ...]
    """Prometheus' ``job`` labels of those series."""
    sources: int
    """Distinct scrape targets (``instance``, ``job``, target label) the series came from:
    more than one means two targets speak for the same job and host."""
    seen_age_s: float | None
    """Seconds since the reader last recorded the job's last-sample series (scrape time)."""
    advanced: bool | None
    """The node's readings advanced within the freshness bound (the last-sample series
    changed), whatever the node's clock says."""
    skew_s: float | None
    """Reader's time of the latest sample minus the node's time of its last reading, seconds:
    clock skew plus the summary's age. Shown, never used to decide."""
    span_s: float | None
    """The node's last reading minus its start, seconds (a difference of the node's own
    times, so skew-free)."""
    gpus: tuple[GpuWindow, ...]
