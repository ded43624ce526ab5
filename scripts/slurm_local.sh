#!/bin/bash
# Try the batch scripts against a real scheduler on this machine: bring up a one-node
# Slurm (munged, slurmctld, slurmd; the node claims 16 CPUs) configured in a temporary
# folder, submit slurm/*.sbatch and pbs/train.pbs (through slurm-wlm-torque's qsub), wait
# for them, check their exit codes and results.json, and stop the daemons by PID.
#
#   scripts/slurm_local.sh [WORKDIR]            # the checks; exit 0 when all pass
#   scripts/slurm_local.sh WORKDIR -- COMMAND   # run COMMAND with the local Slurm up
#
# Needs root and Debian's slurm-wlm and slurm-wlm-torque. WORKDIR (default: a new temp
# folder) receives slurm/ (config, state, logs), jobs/ (the jobs' output and run folders),
# jobs.tsv (name id state exit_code output_file) and daemons.pid. The jobs run asgd from
# ASGD_VENV (default: the active $VIRTUAL_ENV, else the PATH). Nothing is left running.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [[ -n ${1:-} && $1 != -- ]]; then work=$1; shift; else work=$(mktemp -d); fi
mkdir -p "$work"; work=$(cd "$work" && pwd)
export ASGD_VENV=${ASGD_VENV:-${VIRTUAL_ENV:-}}
wait_s=${SLURM_LOCAL_TIMEOUT:-90}      # for all the jobs together

(( EUID == 0 )) || { echo "slurm_local: needs root (slurmd runs jobs as their users)" >&2; exit 2; }
for cmd in munged slurmctld slurmd sbatch squeue sinfo scontrol scancel qsub python3; do
  command -v "$cmd" > /dev/null || { echo "slurm_local: no $cmd (apt-get install slurm-wlm slurm-wlm-torque)" >&2; exit 2; }
done

D=$work/slurm; J=$work/jobs
mkdir -p "$D"/{munge,state,spool,log} "$J"; chmod 700 "$D"; chmod 711 "$D/munge"
pids=()
stop() {   # scancel what is left, then TERM (KILL after 5 s) each daemon we started
  trap - EXIT
  # scancel only on our own cluster, never on a real one this machine may belong to
  if [[ ${SLURM_CONF:-} == "$D/slurm.conf" ]]; then scancel --user="$(id -un)" 2>/dev/null || true; fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid=${pids[i]}; kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do   # gone, or a zombie waiting for `wait` below
      st=$(ps -o stat= -p "$pid" || true); [[ -z $st || $st == Z* ]] && break; sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  done
}
trap stop EXIT
trap 'exit 143' TERM INT HUP   # a signal becomes an exit, so that `stop` runs

# munge: our own key and socket, so a system munged (if any) is neither used nor touched.
head -c 1024 /dev/urandom > "$D/munge/key"; chmod 400 "$D/munge/key"
munged -F -f --socket="$D/munge/sock" --key-file="$D/munge/key" --pid-file="$D/munge/pid" \
  --seed-file="$D/munge/seed" --log-file="$D/log/munged.log" > "$D/log/munged.out" 2>&1 &
pids+=($!)
read -r ctld_port slurmd_port < <(python3 -c '
import socket; s = [socket.socket() for _ in (0, 1)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
host=$(hostname -s)
cat > "$D/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/sock
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
PlugStackConfig=$D/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmi2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=16 Sockets=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
: > "$D/plugstack.conf"     # no site SPANK plugins (the system's plugstack.conf is not read)
export SLURM_CONF=$D/slurm.conf
# The node claims 16 CPUs the machine may not have: Open MPI's mpiexec would refuse to
# bind more ranks than real cores to cores (MPICH's does not bind).
export PRTE_MCA_hwloc_default_binding_policy=none
for _ in $(seq 50); do [[ -S $D/munge/sock ]] && break; sleep 0.1; done
slurmctld -D -f "$SLURM_CONF" > "$D/log/slurmctld.out" 2>&1 & pids+=($!)
slurmd -D -f "$SLURM_CONF" > "$D/log/slurmd.out" 2>&1 & pids+=($!)
echo "${pids[*]}" > "$work/daemons.pid"
state=
for _ in $(seq 150); do   # up to 15 s for the node to be idle
  state=$(sinfo -h -o %T 2>/dev/null || true); [[ $state == idle ]] && break; sleep 0.1
done
[[ $state == idle ]] || { echo "slurm_local: node not idle ($state); logs in $D/log" >&2; tail "$D"/log/*; exit 1; }
echo "slurm_local: Slurm up in ${SECONDS}s in $D (daemons ${pids[*]})"

if [[ ${1:-} == -- ]]; then shift; status=0; "$@" || status=$?; exit "$status"; fi

# The jobs. The training jobs wait for the first (afterany), so that on a cold numba cache
# one job compiles the kernels and the rest load them, rather than all compiling at once on
# few cores. The calibration, the longest job, starts at once (its first probe is one rank
# that fills the cache itself) and beside the others: calibrate.sbatch asks for the node
# --exclusive, which here, where every job is ours and shares one machine anyway, only
# queued it behind the training jobs and the PBS job behind it (--exclusive=user: not
# beside other users' jobs). Each also has a Slurm time limit and an ASGD_TIMEOUT: nothing
# here can hang.
cd "$J"
# 4 epochs: the training phase must outlast results' MIN_TRAIN_S (10 ms) for a rate; one
# epoch of 2-1000-2 trained in 9.5 ms on a quiet znver5 (2026-11-29) and had none
small=(--epochs 4 --hidden 1000 --quiet)
names=() ids=()
submit() {   # submit NAME COMMAND...: sbatch says "Submitted batch job ID", qsub "ID"
  local out; out=$("${@:2}") || { echo "slurm_local: $1: submission failed: $out" >&2; exit 1; }
  names+=("$1"); ids+=("${out##* }")
}
export ASGD_TIMEOUT=120
submit train env ASGD_LAUNCHER=srun ASGD_OUT="$J/train" \
  sbatch -n 4 -t 3 "$repo/slurm/train.sbatch" --epochs 4 --hidden 1000 --quiet
after=--dependency=afterany:${ids[0]}
submit sweep env ASGD_LAUNCHER=mpiexec ASGD_SWEEP="2 3" ASGD_OUT="$J/sweep" \
  sbatch -n 3 -t 3 "$after" "$repo/slurm/sweep.sbatch" "${small[@]}"
submit bad env ASGD_OUT="$J/bad" \
  sbatch -n 2 -t 3 "$after" "$repo/slurm/train.sbatch" --batch 0
submit calibrate env ASGD_OUT="$J" \
  sbatch -t 3 --exclusive=user "$repo/slurm/calibrate.sbatch" --quick
submit pbs env ASGD_ARGS="${small[*]}" ASGD_OUT="$J/pbs" \
  qsub -V -l nodes=1:ppn=3,walltime=00:03:00 -W depend=afterany:${ids[0]} "$repo/pbs/train.pbs"
echo "slurm_local: submitted ${names[*]} as jobs ${ids[*]}"; t0=$SECONDS

deadline=$(( SECONDS + wait_s ))
for id in "${ids[@]}"; do   # squeue lists a job until it ends
  while [[ -n $(squeue -h -j "$id" 2>/dev/null) ]]; do
    (( SECONDS < deadline )) || { echo "slurm_local: jobs still running after ${wait_s}s" >&2; squeue >&2; exit 1; }
    sleep 0.2
  done
done

echo "slurm_local: all jobs ended after $(( SECONDS - t0 ))s"

# Exit codes from the job records (no accounting here, so no sacct; MinJobAge keeps them).
field() { grep -o "\b$1=[^ ]*" <<< "$rec" | head -1 | cut -d= -f2-; }
: > "$work/jobs.tsv"
for i in "${!ids[@]}"; do
  rec=$(scontrol show job "${ids[i]}" 2>&1) || true
  printf '%s\t%s\t%s\t%s\t%s\n' "${names[i]}" "${ids[i]}" "$(field JobState)" \
    "$(field ExitCode)" "$(field StdOut)" | tee -a "$work/jobs.tsv"
done

# The checks: exit codes (ExitCode=status:signal) and the results each job should leave.
fail=0
check() { if "${@:2}"; then echo "ok:   $1"; else echo "FAIL: $1"; fail=1; fi; }
code() { awk -F'\t' -v n="$1" '$1 == n {print $4}' "$work/jobs.tsv"; }
results() { "${ASGD_VENV:+$ASGD_VENV/bin/}python3" -c 'import json, sys
for f in sys.argv[1:]: r = json.load(open(f)); assert r["schema"] == 1 and r["metrics"]["history"], f' "$@"; }
check "train job exit 0"              [ "$(code train)" = 0:0 ]
check "train results.json"            results "$J/train/results.json"
check "sweep job exit 0"              [ "$(code sweep)" = 0:0 ]
check "sweep results.json n2 n3"      results "$J/sweep/n2/results.json" "$J/sweep/n3/results.json"
check "sweep scaling.png"             [ -s "$J/sweep/scaling.png" ]
check "bad job exit non-zero"         [ "$(code bad)" != 0:0 ]
check "calibrate job exit 0"          [ "$(code calibrate)" = 0:0 ]
check "calibrate params.json"         [ -s "$J/params.json" ]
check "pbs job exit 0"                [ "$(code pbs)" = 0:0 ]
check "pbs results.json"              results "$J/pbs/results.json"
if (( fail )); then
  for f in "$J"/*.out "$J"/*.pbs.[oe]*; do [[ -f $f ]] && { echo "=== $f"; tail -20 "$f"; }; done
  echo "slurm_local: checks failed; daemon logs in $D/log" >&2; exit 1
fi
echo "slurm_local: all checks passed"
