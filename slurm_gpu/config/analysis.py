"""Settings of the diagnosis: rule thresholds and recommendation headroom."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_gpu.config.fields import setting


@dataclass(frozen=True)
class AnalysisSettings:
    """Thresholds of the diagnosis rules and the headroom of recommendations (units in names)."""

    min_elapsed_s: int = setting(
        120, "Jobs shorter than this get 'not enough data' instead of a diagnosis.", min=0
    )
    min_samples: int = setting(3, "GPU readings needed before a GPU is diagnosed.", min=1)
    idle_pct: float = setting(
        5.0, "A timeline bucket at or below this duty cycle counts as idle.", min=0, max=100
    )
    unused_max_duty_pct: float = setting(
        1.0, "An allocated GPU whose mean duty cycle stays at or below this is unused.", min=0
    )
    low_duty_pct: float = setting(
        50.0, "A mean duty cycle below this is low utilization.", min=0, max=100
    )
    small_memory_pct: float = setting(
        40.0, "A GPU memory peak below this share of capacity is little memory.", min=0, max=100
    )
    steady_max_idle_pct: float = setting(
        50.0, "Low duty cycle is 'steady' when at most this share of readings is idle.", min=0
    )
    low_sm_active_pct: float = setting(
        25.0, "SM activity below this on a busy GPU means kernels too small to fill it.", min=0
    )
    cpu_saturated_pct: float = setting(
        75.0, "Host cores busy at or above this share of the allocation saturate it.", min=0
    )
    stall_share_pct: float = setting(
        25.0,
        "Share of time with low GPU duty cycle and saturated CPUs that makes a job input-bound.",
        min=0,
        max=100,
    )
    min_cpus_per_gpu: int = setting(
        4, "Fewer allocated cores per GPU than this is too few when the CPUs are busy.", min=1
    )
    tensor_idle_pct: float = setting(
        5.0,
        "Tensor activity at or below this share of busy time means unused.",
        min=0,
        max=100,
    )
    tensor_busy_min_duty_pct: float = setting(
        30.0, "Tensor cores are judged only on GPUs at least this busy.", min=0, max=100
    )
    tensor_min_compute_major: int = setting(
        7, "Lowest compute capability (major) that has tensor cores.", min=1
    )
    near_full_memory_pct: float = setting(
        95.0, "A GPU memory peak at or above this share of capacity is near OOM.", min=0, max=100
    )
    oversized_memory_pct: float = setting(
        25.0, "A GPU memory peak below this share of capacity fits a smaller GPU.", min=0, max=100
    )
    oversized_duty_pct: float = setting(
        30.0, "... when the mean duty cycle is also below this.", min=0, max=100
    )
    imbalance_spread_pct: float = setting(
        30.0, "Spread (max - min) of the used GPUs' mean duty cycles that is imbalance.", min=0
    )
    comm_idle_traffic_pct: float = setting(
        20.0,
        "Share of NVLink bytes moved while the GPU was idle that is a communication wait.",
        min=0,
        max=100,
    )
    stacks_min_samples: int = setting(
        30,
        "Stack samples (docs/stacks.md) needed before they confirm, withdraw or explain a finding.",
        min=1,
    )
    stacks_confirm_input_pct: float = setting(
        20.0,
        "The main processes waiting for input in at least this share of stack samples "
        "confirms a data-loading finding.",
        min=0,
        max=100,
    )
    stacks_withdraw_input_pct: float = setting(
        5.0,
        "... in less than this share withdraws it (the stacks say the GPUs waited for "
        "something else).",
        min=0,
        max=100,
    )
    time_used_max_pct: float = setting(
        40.0, "Elapsed below this share of the time limit is over-requested time.", min=0
    )
    time_unused_min_s: int = setting(
        3600, "... and only when at least this much of the limit went unused.", min=0
    )
    cpu_efficiency_max_pct: float = setting(
        25.0, "CPU efficiency (as seff) below this is over-requested cores.", min=0, max=100
    )
    cpu_idle_min_cores: int = setting(
        4, "... and only when at least this many cores went unused.", min=0
    )
    mem_efficiency_max_pct: float = setting(
        25.0, "Memory efficiency (as seff) below this is over-requested memory.", min=0, max=100
    )
    mem_unused_min_bytes: int = setting(
        8 * 1024**3, "... and only when at least this much memory went unused.", min=0
    )
    idle_edge_min_s: float = setting(
        600.0, "An idle head or tail at least this long is reported ...", min=0
    )
    idle_edge_min_pct: float = setting(
        10.0, "... when it is also at least this share of the job.", min=0, max=100
    )
    idle_edge_major_pct: float = setting(
        30.0,
        "An idle head or tail at least this share of the job is reported however short it is.",
        min=0,
        max=100,
    )
    near_threshold_band_pct: float = setting(
        20.0,
        "Over-request values within this share of their threshold give an info note, "
        "not a warning.",
        min=0,
        max=100,
    )
    dataloader_max_duty_pct: float = setting(
        80.0,
        "Input-bound is judged up to this mean duty cycle: timeline buckets below it with "
        "saturated cores are stalls.",
        min=0,
        max=100,
    )
    cpu_saturated_strict_pct: float = setting(
        90.0,
        "Up to dataloader_max_duty_pct (above low_duty_pct), cores busy at or above this share "
        "of the allocation count as saturated.",
        min=0,
        max=100,
    )
    busy_low_power_pct: float = setting(
        35.0,
        "A busy GPU drawing less than this share of its power limit is nearly empty "
        "(used where SM activity is not reported).",
        min=0,
        max=100,
    )
    busy_low_memory_util_pct: float = setting(
        20.0,
        "Where SM activity is not reported, a busy GPU at low power is nearly empty only if "
        "its memory controller was busy less than this share of the time (memory-bound "
        "kernels also draw little power); not checked where memory utilization is unknown.",
        min=0,
        max=100,
    )
    main_process_min_cores: float = setting(
        0.85,
        "Cores busy per used GPU that count as one core kept busy: a GPU with no kernel in a "
        "reading while this many cores worked waited on one process (a DataLoader with "
        "num_workers=0), whatever the allocation.",
        min=0,
    )
    starved_min_span_pct: float = setting(
        25.0,
        "A GPU at or below unused_max_duty_pct still counts as used (starved, not unused) when "
        "readings with kernels span at least this share of the job's time.",
        min=0,
        max=100,
    )
    idle_phase_min_s: float = setting(
        300.0,
        "A mid-job run of idle timeline buckets at least this long is an idle phase.",
        min=0,
    )
    idle_phases_min_count: int = setting(
        3, "Idle phases on one GPU from which they are reported as recurring.", min=1
    )
    idle_phases_min_pct: float = setting(
        10.0,
        "... when they also add up to at least this share of the used GPUs' time.",
        min=0,
        max=100,
    )
    ragged_tail_min_pct: float = setting(
        3.0,
        "GPUs that stopped working before the job's last one (by idle_phase_min_s or more) "
        "are a ragged tail when the GPU-hours they sat idle reach this share of the job's.",
        min=0,
        max=100,
    )
    exclusive_partitions: tuple[str, ...] = setting(
        [], "Partitions that allocate whole nodes: no CPU, memory or GPU-count reductions there."
    )
    exclusive_partitions_from_slurm: bool = setting(
        True,
        "The collector also treats the partitions Slurm configures OverSubscribe=EXCLUSIVE "
        "as whole-node partitions (scontrol show partition, read once per pass).",
    )
    whole_node_alloc_factor: float = setting(
        2.0,
        "Allocated CPUs or memory more than this many times the request mark a whole-node "
        "allocation (--exclusive or an exclusive partition).",
        min=1,
    )
    threads_per_core: int = setting(
        0,
        "Hardware threads per physical core on the GPU nodes (2 with SMT/Hyper-Threading, 1 "
        "without), where Slurm counts threads as CPUs; 0: unknown. Host-bound judgements then "
        "count physical cores (48 cores of a 96-thread allocation all busy is 100 %, not 50 %); "
        "unknown, they count Slurm's CPUs and the findings say so.",
        min=0,
    )
    ranks_per_gpu_min: int = setting(
        4,
        "Compute processes on every used GPU of a node from which ranks sharing (time-slicing) "
        "the GPUs are named, when no GPU of the node sat idle with a context.",
        min=2,
    )
    throttle_min_pct: float = setting(
        10.0, "Throttled for at least this share of the job is reported to the site.", min=0
    )
    headroom_time_pct: float = setting(30.0, "Headroom over the longest run for --time.", min=0)
    headroom_mem_pct: float = setting(
        25.0, "Headroom over the peak resident memory for --mem.", min=0
    )
    headroom_gpu_mem_pct: float = setting(
        20.0, "Headroom over the GPU memory peak when choosing a MIG slice.", min=0
    )
    headroom_cpu_pct: float = setting(
        25.0, "Headroom over the busiest cores for --cpus-per-gpu.", min=0
    )
    time_round_s: int = setting(900, "--time is rounded up to a multiple of this.", min=60)
    time_round_long_s: int = setting(
        3600, "... or of this, for times longer than time_round_long_after_s.", min=60
    )
    time_round_long_after_s: int = setting(
        14400, "Where the coarser --time rounding begins.", min=0
    )
    mem_round_bytes: int = setting(1024**3, "--mem is rounded up to a multiple of this.", min=1)
    mig_partitions: tuple[str, ...] = setting(
        [], "Partitions whose GPUs are MIG slices; empty: never recommend a MIG profile."
    )
    smaller_gpu_types: tuple[str, ...] = setting(
        [],
        "GPU types smaller than the whole GPUs jobs usually get, each 'type:memory_GiB' or "
        "'partition:type:memory_GiB' (the type as gres.conf names it). GPU_OVERSIZED then "
        "suggests the smallest that holds the job's GPU memory peak plus headroom, with its "
        "exact request; empty (and no mig_partitions): never a smaller GPU, and the remedy is "
        "more work per GPU.",
    )
    mig_profiles: tuple[str, ...] = setting(
        ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        "MIG profiles offered in mig_partitions (memory read from the name).",
    )
