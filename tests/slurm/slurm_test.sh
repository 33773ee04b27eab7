#!/bin/bash
# A real Slurm (Debian's slurm-wlm + munge) on namespace hosts on this
# machine: slurmctld on host "ctl", slurmd nodes n1 and n2 on hosts of their
# own (10.77.0.1-3, a bridge in its own namespace, no route out). Runs the
# shipped deploy/slurm/lockstep.sbatch: a 2-node job to the end (its
# manifest and digest against `lockstep run`), scancel of a running job
# (no rank left), scontrol requeue (resumed from the newest checkpoint),
# USR1 before the time limit (checkpoint there, requeue, resume).
#   tests/slurm/slurm_test.sh LOCKSTEP_BINARY SOURCE_DIR
# Exit 0 passed, 1 failed, 77 skipped (not root, Slurm not installed).
set -uo pipefail
lockstep=$(realpath "$1")
source_dir=$(realpath "$2")
sbatch_script="$source_dir/deploy/slurm/lockstep.sbatch"

if [[ $(id -u) -ne 0 ]]; then echo "SKIP: a Slurm of our own needs root"; exit 77; fi
for tool in slurmctld slurmd munged mungekey sbatch ip; do
  command -v "$tool" > /dev/null || { echo "SKIP: $tool is missing (bash deploy/install-deps.sh installs it)"; exit 77; }
done

tmp=$(mktemp -d /tmp/lockstep-slurm-XXXXXX)
ns="lsk$$-s"
failures=0
passes=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; passes=$((passes + 1)); }

cleanup() {
  for pidfile in "$tmp"/*.pid; do [[ -f $pidfile ]] && kill "$(cat "$pidfile")" 2> /dev/null; done
  pkill -f "$tmp/" 2> /dev/null
  sleep 1
  pkill -9 -f "$tmp/" 2> /dev/null
  for host in br ctl n1 n2; do ip netns del "$ns-$host" 2> /dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# Hosts.
ip netns add "$ns-br" && ip -n "$ns-br" link add br0 type bridge && ip -n "$ns-br" link set br0 up || exit 1
i=0
for host in ctl n1 n2; do
  i=$((i + 1))
  ip netns add "$ns-$host" || exit 1
  ip link add eth0 netns "$ns-$host" type veth peer name "p$i" netns "$ns-br" || exit 1
  ip -n "$ns-br" link set "p$i" master br0 && ip -n "$ns-br" link set "p$i" up
  ip -n "$ns-$host" addr add "10.77.0.$i/24" dev eth0
  ip -n "$ns-$host" link set eth0 up && ip -n "$ns-$host" link set lo up
done
on() {  # on HOST COMMAND...: runs it on that host, with its host name
  local host=$1
  shift
  ip netns exec "$ns-$host" unshare --uts --mount --propagation private -- \
    /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

# munge and Slurm, every file under $tmp.
mungekey -c -k "$tmp/munge.key" || exit 1
munged --force -S "$tmp/munge.sock" --key-file="$tmp/munge.key" --log-file="$tmp/munged.log" \
  --pid-file="$tmp/munged.pid" --seed-file="$tmp/munged.seed" || { echo "munged did not start"; exit 1; }
mkdir -p "$tmp/state" "$tmp/spool/n1" "$tmp/spool/n2" "$tmp/runs"
# cred_expire=10: a requeued job waits the credential lifetime before it
# starts again, 120 s by default (two requeues: four minutes of waiting).
cat > "$tmp/slurm.conf" << CONF
ClusterName=lockstep-test
SlurmctldHost=ctl(10.77.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.sock,cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd-%n.log
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
KillWait=5
NodeName=n1 NodeAddr=10.77.0.2 CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=10.77.0.3 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# This kernel mounts cgroup v1 and v2 side by side (Slurm refuses that
# "hybrid"), and ip netns exec remounts /sys: each slurmd gets the v1
# hierarchies mounted again in its own mount namespace.
printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n' > "$tmp/cgroup.conf"
cat > "$tmp/cgroups.sh" << 'SH'
mount -t tmpfs none /sys/fs/cgroup
for c in cpu cpuacct cpuset memory devices freezer pids; do
  mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c
done
SH
export SLURM_CONF="$tmp/slurm.conf"
on ctl slurmctld -D -i > "$tmp/slurmctld.out" 2>&1 &
for node in n1 n2; do
  on "$node" /bin/sh -c ". $tmp/cgroups.sh; exec slurmd -D -N $node" > "$tmp/slurmd-$node.out" 2>&1 &
done
for _ in $(seq 60); do
  idle=$(on ctl sinfo -h -o '%T %D' 2> /dev/null | awk '$1 == "idle" {print $2}')
  [[ $idle == 2 ]] && break
  sleep 0.5
done
if [[ ${idle:-} != 2 ]]; then
  echo "Slurm did not come up:"; tail -n 20 "$tmp"/slurmctld.out "$tmp"/slurmd-*.out "$tmp"/*.log
  exit 1
fi
pass "slurmctld on ctl, slurmd n1 and n2 on hosts of their own, both idle"

submit() {  # submit NAME [--set ...]: prints the job id
  local name=$1
  shift
  (cd "$tmp" && on ctl env LOCKSTEP="$lockstep" LOCKSTEP_RUN_DIR="$tmp/runs" \
    sbatch --parsable -o "$tmp/$name-%j.out" "$sbatch_script" "$source_dir/examples/synthetic.toml" \
    --set job.threads_per_rank=1 --set fault.heartbeat_s=0.5 "$@")
}
job_state() { on ctl scontrol show job "$1" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
wait_state() {  # wait_state JOB SECONDS STATE...
  local job=$1 limit=$2 state
  shift 2
  for _ in $(seq $((limit * 2))); do
    state=$(job_state "$job")
    for want in "$@"; do [[ $state == "$want" ]] && return 0; done
    sleep 0.5
  done
  echo "job $job is $state after ${limit} s (wanted $*)"
  return 1
}
# This test's lockstep processes: those in its hosts' network namespaces
# (other tests may run lockstep elsewhere on the machine at the same time).
ours() {
  local pid
  for pid in $(for host in ctl n1 n2; do ip netns pids "$ns-$host" 2> /dev/null; done); do
    tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | grep -qE "^$lockstep (worker|coordinator)" &&
      echo "$pid $(tr '\0' ' ' < "/proc/$pid/cmdline")"
  done
}
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# The uninterrupted digest on this host.
reference=$(mktemp -d "$tmp/reference-XXXX")
(cd "$reference" && "$lockstep" run "$source_dir/examples/synthetic.toml" --nproc 2 \
  --set job.threads_per_rank=1 --set job.run_dir="$reference/runs" --set job.steps=200 \
  --set checkpoint.every=20 > "$reference/out.txt" 2>&1) || { echo "reference run failed"; cat "$reference/out.txt"; exit 1; }
expected=$(json "$(ls -d "$reference"/runs/*)/manifest.json" 'd["metrics"]["final_param_digest"]')

# 1. A 2-node job to the end.
job=$(submit full --set job.steps=200 --set checkpoint.every=20)
if wait_state "$job" 120 COMPLETED FAILED CANCELLED; then
  manifest="$tmp/runs/slurm-$job/manifest.json"
  state=$(job_state "$job")
  [[ $state == COMPLETED ]] && pass "job $job completed" || fail "job $job ended $state: $(tail -n 30 "$tmp"/full-"$job".out)"
  if [[ -f $manifest ]]; then
    [[ $(json "$manifest" 'd["status"]') == completed ]] && pass "manifest: completed" || fail "manifest status"
    hosts=$(json "$manifest" '" ".join(sorted(set(w["host"] for w in d["coordinator"]["workers"])))')
    [[ $hosts == "n1 n2" ]] && pass "one rank on each node ($hosts)" || fail "ranks on hosts '$hosts'"
    digest=$(json "$manifest" 'd["metrics"]["final_param_digest"]')
    [[ $digest == "$expected" ]] && pass "digest equals lockstep run's" || fail "digest $digest != $expected"
  else
    fail "no manifest at $manifest"
  fi
else
  fail "job $job did not end: $(tail -n 30 "$tmp"/full-"$job".out)"
fi

# 2. scancel of a running job leaves no rank behind.
job=$(submit cancel --set job.steps=1000000)
events="$tmp/runs/slurm-$job/events-rank1.jsonl"
for _ in $(seq 120); do grep -q '"event":"step"' "$events" 2> /dev/null && break; sleep 0.5; done
if grep -q '"event":"step"' "$events" 2> /dev/null; then
  on ctl scancel "$job"
  left=1
  for _ in $(seq 60); do
    [[ -z $(ours) ]] && { left=0; break; }
    sleep 0.5
  done
  ((left == 0)) && pass "scancel: no lockstep process left" || fail "scancel: still running: $(ours)"
else
  fail "job $job never trained: $(tail -n 30 "$tmp"/cancel-"$job".out)"
  on ctl scancel "$job"
fi

# 3. scontrol requeue: the next start resumes from the newest checkpoint.
job=$(submit requeue --set job.steps=200 --set checkpoint.every=20)
checkpoint_glob="$tmp/runs/slurm-$job/checkpoints/step-*/index.json"
for _ in $(seq 240); do compgen -G "$checkpoint_glob" > /dev/null && break; sleep 0.25; done
if compgen -G "$checkpoint_glob" > /dev/null; then
  on ctl scontrol requeue "$job"
  if wait_state "$job" 180 COMPLETED FAILED; then
    out="$tmp/requeue-$job.out"
    grep -q "resuming $tmp/runs/slurm-$job" "$out" && pass "requeued job resumed from its checkpoint" || fail "no resume in: $(tail -n 40 "$out")"
    manifest="$tmp/runs/slurm-$job/manifest.json"
    [[ -f $manifest && $(json "$manifest" 'd["status"]') == completed ]] && pass "requeued job completed" || fail "requeued job did not complete"
    digest=$(json "$manifest" 'd["metrics"]["final_param_digest"]' 2> /dev/null)
    [[ $digest == "$expected" ]] && pass "requeued job's digest equals the uninterrupted run's" || fail "requeue digest $digest != $expected"
  else
    fail "requeued job $job did not end: $(tail -n 40 "$tmp"/requeue-"$job".out)"
  fi
else
  fail "job $job wrote no checkpoint: $(tail -n 30 "$tmp"/requeue-"$job".out)"
fi

# 4. USR1 to the batch shell (what --signal=B:USR1@60 sends before the time
# limit): the ranks stop after a step they agree on with a checkpoint there
# (no periodic checkpoint falls before the end), the job is requeued and
# resumes from that step to the uninterrupted digest.
# A longer run than the others (the stop must land before its end), with
# its own uninterrupted digest.
long="$reference/long"
mkdir -p "$long"
(cd "$long" && "$lockstep" run "$source_dir/examples/synthetic.toml" --nproc 2 \
  --set job.threads_per_rank=1 --set job.run_dir="$long/runs" --set job.steps=1000 > "$long/out.txt" 2>&1) ||
  { echo "long reference run failed"; cat "$long/out.txt"; exit 1; }
expected_long=$(json "$(ls -d "$long"/runs/*)/manifest.json" 'd["metrics"]["final_param_digest"]')
job=$(submit usr1 --set job.steps=1000 --set checkpoint.every=5000)
events="$tmp/runs/slurm-$job/events-rank1.jsonl"
for _ in $(seq 120); do grep -q '"event":"step"' "$events" 2> /dev/null && break; sleep 0.25; done
if grep -q '"event":"step"' "$events" 2> /dev/null; then
  on ctl scancel --batch --signal=USR1 "$job"
  if wait_state "$job" 180 COMPLETED FAILED; then
    out="$tmp/usr1-$job.out"
    stop=$(grep -o 'stopped after step [0-9]* of 1000 on request, with a checkpoint there' "$out" | grep -o '[0-9]*' | head -n 1)
    if [[ -n $stop ]] && ((stop < 1000)); then pass "USR1: every rank stopped after step $stop with a checkpoint"; else fail "USR1: no stop in: $(tail -n 40 "$out")"; fi
    grep -q "stopped at a checkpoint: requeueing job $job" "$out" && pass "USR1: requeued after the stop" || fail "USR1: not requeued: $(tail -n 40 "$out")"
    grep -q "resumed from the checkpoint at step ${stop:-?}" "$out" && pass "USR1: resumed from step $stop" || fail "USR1: no resume from step ${stop:-?} in: $(tail -n 40 "$out")"
    manifest="$tmp/runs/slurm-$job/manifest.json"
    digest=$(json "$manifest" 'd["metrics"]["final_param_digest"]' 2> /dev/null)
    [[ $digest == "$expected_long" ]] && pass "USR1: digest equals the uninterrupted run's" || fail "USR1 digest $digest != $expected_long"
  else
    fail "USR1 job $job did not end: $(tail -n 40 "$tmp"/usr1-"$job".out)"
  fi
else
  fail "job $job never trained: $(tail -n 30 "$tmp"/usr1-"$job".out)"
fi

echo "slurm: $passes passed, $failures failed"
((failures == 0))
