#!/bin/sh
# slurm-gpu EpilogSlurmctld: queue the ended job for the one collector that drains the queue.
#
# slurm.conf:   EpilogSlurmctld=/etc/slurm/epilog-slurmctld.d/slurm-gpu.sh  (this file, 0755)
#
# slurmctld runs this as SlurmUser once per ended job (array tasks included), with
# SLURM_JOB_ID set but no SLURM_CONF and no PATH worth the name, and the job stays COMPLETING
# until it returns. So it never waits and never starts one process per job: it creates an
# empty file named by the job id in QUEUE (no content: nothing to parse) and, only when no
# drainer holds QUEUE/.drain.lock, starts one detached `slurm-gpu collect --queue`. That
# drainer stores every queued job as one batch (waiting up to collector.queue_wait_s for
# records and accounting) and exits when the queue is empty; its wrapper looks at the queue
# once more after releasing the lock, so a job queued at that moment is not missed.
#
# The records are root-only, so when SlurmUser is not root the drainer is started through
# `sudo -n`, which needs exactly this sudoers line (visudo -f /etc/sudoers.d/slurm-gpu):
#
#   slurm ALL=(root) NOPASSWD: /opt/slurm-gpu/bin/slurm-gpu --config /etc/slurm-gpu/config.toml collect --queue
#
# QUEUE must exist, belong to SlurmUser, mode 0700, in a root-owned directory, and equal
# paths.queue_dir of the configuration:
#
#   install -d -o slurm -g slurm -m 0700 /var/spool/slurm-gpu-queue
#
# Without the sudoers line nothing breaks: the periodic collector (systemd timer) stores the
# jobs and empties the queue.

# Edit these lines (absolute paths), or set them in slurmctld's environment.
SLURM_GPU=${SLURM_GPU_BIN:-/opt/slurm-gpu/bin/slurm-gpu}
CONFIG=${SLURM_GPU_CONFIG:-/etc/slurm-gpu/config.toml}
QUEUE=${SLURM_GPU_QUEUE_DIR:-/var/spool/slurm-gpu-queue}
# Where the detached drainer's output goes (must be writable by SlurmUser).
LOG=${SLURM_GPU_COLLECT_LOG:-/var/log/slurm-gpu/collect.log}

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
cd / || exit 0

# A raw job id: digits only, and short (nothing else ever becomes a file name).
case "${SLURM_JOB_ID:-}" in
'' | 0* | *[!0-9]*) exit 0 ;;
esac
[ "${#SLURM_JOB_ID}" -le 20 ] || exit 0
[ -x "$SLURM_GPU" ] && [ -d "$QUEUE" ] || exit 0

# Queue the job: an empty file, created exclusively (noclobber); already queued is fine.
(set -C && : >"$QUEUE/$SLURM_JOB_ID") 2>/dev/null

# A drainer already running takes it (it looks at the queue again before it exits).
flock -n "$QUEUE/.drain.lock" true 2>/dev/null || exit 0

if [ "$(id -u)" -eq 0 ]; then
    set -- "$SLURM_GPU" --config "$CONFIG" collect --queue
else
    set -- sudo -n "$SLURM_GPU" --config "$CONFIG" collect --queue
fi
# A log we cannot open must not keep the job in COMPLETING.
if ! { : >>"$LOG"; } 2>/dev/null; then
    LOG=/dev/null
fi
# The wrapper holds the lock for the drainer's whole run, so at most one drainer exists; after
# it exits and the lock is released, a job queued meanwhile starts another round (bounded).
# shellcheck disable=SC2016
setsid -f /bin/sh -c '
    lock=$1 queue=$2
    shift 2
    exec 9>>"$lock" || exit 0
    round=0
    while [ "$round" -lt 100 ]; do
        round=$((round + 1))
        flock -n 9 || exit 0
        "$@" 9>&- || exit 0
        flock -u 9
        # The names the drainer takes: raw job ids, regular files.
        [ -n "$(find "$queue" -maxdepth 1 -type f -name "[1-9]*" ! -name "*[!0-9]*" \
            2>/dev/null | head -n 1)" ] || exit 0
    done
' slurm-gpu-drain "$QUEUE/.drain.lock" "$QUEUE" "$@" </dev/null >>"$LOG" 2>&1 || true
exit 0
