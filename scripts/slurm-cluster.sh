#!/usr/bin/env bash
# A one-node Slurm cluster of the tests' own, from Debian's packages (slurmctld, slurmd,
# slurm-client, munge): its own munge key and socket, its own ports, configuration, state and
# spool under one directory, the node being this host. Idempotent; prints the SLURM_CONF value
# to export (every Slurm command, and casebatch's Slurm runtime, read the cluster from it).
#   export SLURM_CONF=$(bash scripts/slurm-cluster.sh)    # start it, or find it running
#   bash scripts/slurm-cluster.sh stop                    # stop it (its directory stays)
# CASEBATCH_SLURM_DIR names the directory (default /tmp/casebatch-slurm): a test that kills a
# daemon starts a cluster of its own in a directory of its own. CASEBATCH_SLURM_FIRST_JOB sets
# the cluster's first job id (default: from the directory's name), so two clusters on one host
# never share a job's cgroup.
#
# What the configuration says, and why:
# - SlurmUser and SlurmdUser root, jobs run as the submitting user;
# - select/cons_tres with memory a consumable resource, task/cgroup and proctrack/cgroup with
#   ConstrainRAMSpace: `--mem` is enforced, and a job over it ends OUT_OF_MEMORY;
# - one partition `debug` with OverSubscribe=FORCE:64 and DefMemPerCPU=64, so many short jobs
#   run at once on a small machine (a job that names no memory takes 64 MB of the node's);
# - SlurmdTimeout=10: a node whose slurmd is gone is DOWN (and its jobs NODE_FAIL) in seconds;
# - no accounting daemon: a finished job is known to the controller for MinJobAge (300 s).
set -euo pipefail
dir="${CASEBATCH_SLURM_DIR:-/tmp/casebatch-slurm}"
conf="$dir/slurm.conf"

answers() { SLURM_CONF="$conf" scontrol ping 2>/dev/null | grep -q "is UP"; }
node_ready() {
  SLURM_CONF="$conf" sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'
}

stop() {
  for daemon in slurmd slurmctld munged; do
    if [ -f "$dir/$daemon.pid" ]; then
      kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true
    fi
  done
  for daemon in slurmd slurmctld munged; do
    if [ -f "$dir/$daemon.pid" ]; then
      pid=$(cat "$dir/$daemon.pid")
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$daemon.pid"
    fi
  done
}

if [ "${1:-start}" = stop ]; then
  stop
  exit 0
fi

for tool in slurmctld slurmd sbatch munged; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "no $tool (Debian: apt-get install slurmctld slurmd slurm-client munge)" >&2
    exit 1
  }
done

if answers && node_ready; then
  echo "$conf"
  exit 0
fi
stop
mkdir -p "$dir/state" "$dir/spool"

# Munge: the key of this cluster alone, and a socket every Slurm command is told of.
if [ ! -f "$dir/munge.key" ]; then
  head -c 1024 /dev/urandom >"$dir/munge.key"
  chmod 400 "$dir/munge.key"
fi
munged --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge.seed"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
node="$(hostname -s)"
cpus="$(nproc)"
memory_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4))
first_job="${CASEBATCH_SLURM_FIRST_JOB:-$(( ($(printf '%s' "$dir" | cksum | cut -d' ' -f1) % 600 + 1) * 100000 ))}"
cat >"$conf" <<EOF
ClusterName=casebatch
SlurmctldHost=$node
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=64
SchedulerType=sched/builtin
FirstJobId=$first_job
MinJobAge=300
SlurmdTimeout=10
ReturnToService=2
InactiveLimit=0
KillWait=5
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:64
EOF
cat >"$dir/cgroup.conf" <<EOF
CgroupPlugin=autodetect
ConstrainRAMSpace=yes
EOF

# Started detached from this shell: the daemons outlive the script, serving the test run.
SLURM_CONF="$conf" setsid slurmctld -i </dev/null >>"$dir/slurmctld.out" 2>&1
SLURM_CONF="$conf" setsid slurmd </dev/null >>"$dir/slurmd.out" 2>&1
for _ in $(seq 300); do answers && node_ready && break; sleep 0.1; done
if ! (answers && node_ready); then
  tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  echo "the cluster in $dir did not come up" >&2
  exit 1
fi
echo "$conf"
