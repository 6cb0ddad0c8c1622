#!/bin/sh
# slurm-gpu EpilogSlurmctld: store the job's telemetry as soon as it ends.
#
# slurm.conf:   EpilogSlurmctld=/etc/slurm/epilog-slurmctld.d/slurm-gpu.sh  (this file, 0755)
#
# slurmctld runs this as SlurmUser, with SLURM_JOB_ID set but no SLURM_CONF, no PATH worth
# the name and no GPU variables, and the job stays COMPLETING until it returns. So it only
# starts `slurm-gpu collect --job` detached (setsid) and exits 0 at once; the collector waits
# for the node records and for accounting to settle by itself (--wait). The records are
# root-only, so when SlurmUser is not root the collector is started through `sudo -n`, which
# needs this sudoers line (visudo -f /etc/sudoers.d/slurm-gpu):
#
#   slurm ALL=(root) NOPASSWD: /opt/slurm-gpu/bin/slurm-gpu --config /etc/slurm-gpu/config.toml collect --job * --wait 300
#
# Without it nothing breaks: the periodic collector (systemd timer) stores the job later.

# Edit these two lines (absolute paths), or set them in slurmctld's environment.
SLURM_GPU=${SLURM_GPU_BIN:-/opt/slurm-gpu/bin/slurm-gpu}
CONFIG=${SLURM_GPU_CONFIG:-/etc/slurm-gpu/config.toml}
# Where the detached collector's output goes (must be writable by the collector's user).
LOG=${SLURM_GPU_COLLECT_LOG:-/var/log/slurm-gpu/collect.log}
WAIT_S=300

PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

case "${SLURM_JOB_ID:-}" in
'' | *[!0-9]*) exit 0 ;;
esac
[ -x "$SLURM_GPU" ] || exit 0

if [ "$(id -u)" -eq 0 ]; then
    set -- "$SLURM_GPU" --config "$CONFIG" collect --job "$SLURM_JOB_ID" --wait "$WAIT_S"
else
    set -- sudo -n "$SLURM_GPU" --config "$CONFIG" collect --job "$SLURM_JOB_ID" --wait "$WAIT_S"
fi
# A log we cannot open must not keep the job in COMPLETING.
if ! { : >>"$LOG"; } 2>/dev/null; then
    LOG=/dev/null
fi
setsid -f "$@" </dev/null >>"$LOG" 2>&1 || true
exit 0
