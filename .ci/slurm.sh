#!/usr/bin/env bash
# A one-machine Slurm for CI (issue 36): the autoscaler's Slurm test submits
# jobs with `sbatch` that run `raylet start --address HEAD --block ...` and
# cancels them with `scancel`, so it needs a slurmctld and a slurmd that
# accept and run jobs on this machine.
#
#   .ci/slurm.sh          install (Debian's slurm-wlm and munge) if missing,
#                         configure, start munged, slurmctld and slurmd as
#                         plain daemons (no systemd), wait until the node is
#                         idle; a second run finds them running and only checks
#   .ci/slurm.sh install  only install the packages if missing
#   .ci/slurm.sh stop     cancel every job, then stop slurmd, slurmctld and
#                         munged by the pids in this script's pidfiles: only
#                         the daemons this script started
#
# Knobs (environment):
#   SLURM_CI_CPUS         CPUs the node advertises (default: nproc). More than
#                         the machine has turns on SlurmdParameters=config_overrides.
#   SLURM_CI_MEMORY_MB    RealMemory in MiB (default: 95% of MemTotal)
#   SLURM_CI_TIMEOUT      seconds to wait for each daemon and for the node (60)
#
# Must run as root (Debian 12; other Debian/Ubuntu releases should work too).
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
CTLD_STATE=/var/spool/slurmctld # slurmctld's saved state (jobs, nodes)
SLURMD_SPOOL=/var/spool/slurmd  # slurmd's spool: batch scripts, step sockets
LOG_DIR=/var/log/slurm
# This script's own pidfiles: a daemon is stopped only if its pid is here, so
# a Slurm or munge that something else started is never touched.
RUN_DIR=/run/slurm-ci
MUNGE_KEY=/etc/munge/munge.key
TIMEOUT=${SLURM_CI_TIMEOUT:-60}
NODE=$(hostname -s)
MARKER="# Written by .ci/slurm.sh"

log() { echo "slurm.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "must run as root (it installs packages and starts daemons)"

# is_running PID NAME: whether process PID is alive (not a zombie that no
# one reaps) and is still NAME (a pid can be reused after a crash).
is_running() {
    local state
    [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] || return 1
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)
    [[ -n $state && $state != Z ]]
}

# pid_of NAME: the pid in $RUN_DIR/NAME.pid if that process is running;
# empty otherwise.
pid_of() {
    local name=$1 file=$RUN_DIR/$1.pid pid
    [[ -s $file ]] || return 0
    pid=$(tr -dc 0-9 <"$file")
    [[ -n $pid ]] || return 0
    if is_running "$pid" "$name"; then
        echo "$pid"
    fi
}

# wait_until SECONDS CMD...: retry CMD every half second until it succeeds or
# SECONDS pass (then return 1).
wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

# tails: the end of every log, for a failure message.
tails() {
    local f
    for f in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
        [[ -r $f ]] || continue
        echo "----- tail -n 30 $f" >&2
        tail -n 30 "$f" >&2
    done
}

# --- 1. Packages -------------------------------------------------------------
# Debian's slurm-wlm pulls slurmctld, slurmd and the client commands (sbatch,
# squeue, scancel, sinfo, scontrol); munge is the authentication they use.
restore_policy() {
    if [[ -e /usr/sbin/policy-rc.d.slurm-ci-saved ]]; then
        mv -f /usr/sbin/policy-rc.d.slurm-ci-saved /usr/sbin/policy-rc.d
    else
        rm -f /usr/sbin/policy-rc.d
    fi
}

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    log "installing slurm-wlm and munge"
    # The packages' postinst scripts would start munge, slurmctld and slurmd
    # through invoke-rc.d; a policy-rc.d that exits 101 forbids that (there is
    # no init system to start them, and this script starts them itself with
    # its own configuration). An existing policy-rc.d is put back afterwards.
    if [[ -e /usr/sbin/policy-rc.d ]]; then
        cp -p /usr/sbin/policy-rc.d /usr/sbin/policy-rc.d.slurm-ci-saved
    fi
    printf '#!/bin/sh\n# .ci/slurm.sh: no service starts during install\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap restore_policy EXIT
    apt-get update -qq
    # No recommends: they add the docs and mail programs, not needed here.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
    restore_policy
    trap - EXIT
}

# --- 2. munge ----------------------------------------------------------------
# Every Slurm message is signed with munge, so munged must run before the
# Slurm daemons. The package's postinst makes a key; make one if it is missing
# (a key from a package installed with a broken postinst, or deleted).
munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating $MUNGE_KEY"
        install -d -o munge -g munge -m 0700 /etc/munge
        if command -v mungekey >/dev/null; then
            runuser -u munge -- mungekey --create --keyfile="$MUNGE_KEY"
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
        fi
        chown munge:munge "$MUNGE_KEY"
        chmod 0400 "$MUNGE_KEY"
    fi
    # A munged that answers (ours from a previous run, or the system's) is
    # used as it is.
    if munge_works; then
        return 0
    fi
    log "starting munged"
    # munged runs as the munge user (it refuses keys and sockets with loose
    # owners); its socket and pidfile directory must belong to munge.
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid
    wait_until "$TIMEOUT" munge_works || {
        tails
        die "munged did not answer within ${TIMEOUT}s"
    }
    # munged forks; the pid it wrote, copied to this script's directory, says
    # it is ours to stop.
    cp /run/munge/munged.pid "$RUN_DIR/munged.pid"
}

# --- 3. slurm.conf -----------------------------------------------------------
# One node, this machine, named after `hostname -s` (so slurmd finds itself in
# the file without -N, and SLURM_JOB_NODELIST names a resolvable host) but
# reached at 127.0.0.1, so neither daemon depends on DNS or the network.
write_conf() {
    local nproc mem_total_mb cpus mem overrides="" def_mem tmp
    nproc=$(nproc)
    mem_total_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    cpus=${SLURM_CI_CPUS:-$nproc}
    # A little under the total: slurmd drains a node whose RealMemory is more
    # than it measures, and the measure is a few MiB under MemTotal.
    mem=${SLURM_CI_MEMORY_MB:-$((mem_total_mb * 95 / 100))}
    if ((cpus > nproc || mem > mem_total_mb)); then
        # Advertise more than the machine has (to fit more raylet nodes in a
        # test): slurmd then reports the configured counts instead of the
        # hardware's, and the node is not drained for "Low CPU count".
        overrides=$'SlurmdParameters=config_overrides\n'
    fi
    # A job that asks no --mem gets its CPUs' share of the node's memory, not
    # all of it (the default), so jobs without --mem can share the node.
    def_mem=$((mem / cpus))
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
$MARKER: a one-node Slurm for CI (issue 36).
# It is rewritten on every run; edit the script, not this file.
ClusterName=ci
SlurmctldHost=$NODE(127.0.0.1)
# slurmctld drops to the slurm user the package made; slurmd stays root to
# start jobs as their users.
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$CTLD_STATE
SlurmdSpoolDir=$SLURMD_SPOOL
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# Processes are tracked by their parent pids and jobs are not confined: no
# cgroups, which containers and CI runners often do not delegate.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
# Each CPU is one unit (not each core: with hyperthreads a 1-CPU job would
# take a whole core); memory is a consumable resource too.
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$def_mem
# A node that was down (a slurmd restart) comes back by itself.
ReturnToService=2
# scancel: SIGTERM, then SIGKILL after 5 s (default 30).
KillWait=5
# A job asking more than the node has (CPUs, memory) is refused at sbatch
# ("Requested node configuration is not available") instead of pending
# forever with reason PartitionConfig.
EnforcePartLimits=ALL
# No mail programs are installed.
MailProg=/bin/true
${overrides}NodeName=$NODE NodeHostname=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    install -d -m 0755 "$CONF_DIR"
    if [[ -e $CONF ]] && cmp -s "$tmp" "$CONF"; then
        rm -f "$tmp"
        return 1 # unchanged
    fi
    # A slurm.conf this script did not write is kept aside, once.
    if [[ -e $CONF ]] && ! head -n 1 "$CONF" | grep -qF "$MARKER"; then
        cp -p "$CONF" "$CONF.before-slurm-ci"
        log "kept the previous $CONF as $CONF.before-slurm-ci"
    fi
    install -m 0644 "$tmp" "$CONF"
    rm -f "$tmp"
    return 0 # changed
}

# --- 4. Daemons --------------------------------------------------------------
ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurm() {
    install -d -o slurm -g slurm -m 0755 "$CTLD_STATE" "$LOG_DIR"
    install -d -o root -g root -m 0755 "$SLURMD_SPOOL"
    # The pidfile directory is written by slurmctld after it drops to the
    # slurm user, and by slurmd as root.
    install -d -o slurm -g slurm -m 0755 "$RUN_DIR"
    if [[ -z $(pid_of slurmctld) ]]; then
        pgrep -x slurmctld >/dev/null &&
            die "a slurmctld this script did not start is running; stop it first"
        log "starting slurmctld"
        # -c: start from a clean state (no jobs or node states of an earlier
        # run), -i: ignore state files it cannot read. It daemonizes itself.
        slurmctld -c -i
        wait_until "$TIMEOUT" ctld_up || {
            tails
            die "slurmctld did not answer within ${TIMEOUT}s"
        }
    fi
    if [[ -z $(pid_of slurmd) ]]; then
        pgrep -x slurmd >/dev/null &&
            die "a slurmd this script did not start is running; stop it first"
        log "starting slurmd"
        slurmd
    fi
}

# node_ready: the node takes jobs (idle, or running some on a second run).
node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n 1; }
node_ready() { [[ $(node_state) =~ ^(idle|mixed|allocated)$ ]]; }

wait_ready() {
    if ! wait_until "$TIMEOUT" node_ready; then
        log "node $NODE is '$(node_state)' after ${TIMEOUT}s, not idle"
        sinfo -R >&2 || true
        scontrol show node "$NODE" >&2 || true
        tails
        exit 1
    fi
}

# --- stop ----------------------------------------------------------------------
# stop_daemon NAME: SIGTERM to the pid in our pidfile, SIGKILL after 15 s;
# returns once that process is gone. It is watched by its pid, not by the
# pidfile: slurmctld deletes its pidfile as soon as it gets SIGTERM, then
# saves its state for a while before it exits.
stop_daemon() {
    local name=$1 pid deadline
    pid=$(pid_of "$name")
    if [[ -z $pid ]]; then
        rm -f "$RUN_DIR/$name.pid"
        return 0
    fi
    log "stopping $name ($pid)"
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 15))
    while is_running "$pid" "$name" && ((SECONDS < deadline)); do sleep 0.2; done
    if is_running "$pid" "$name"; then
        log "$name ($pid) did not stop on SIGTERM; SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 5))
        while is_running "$pid" "$name" && ((SECONDS < deadline)); do sleep 0.1; done
    fi
    rm -f "$RUN_DIR/$name.pid"
}

stop_all() {
    # Cancel every job first: a job's processes run under slurmstepd, which
    # outlives slurmd, so a `raylet start --block` job would otherwise stay.
    if [[ -n $(pid_of slurmctld) ]] && ctld_up; then
        local jobs
        jobs=$(squeue -h -o %A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: $(echo $jobs)"
            # shellcheck disable=SC2086
            scancel $jobs || true
            wait_until 30 test -z "$(squeue -h -o %A 2>/dev/null)" ||
                log "jobs still listed after 30 s: $(squeue -h -o '%A %T' | tr '\n' ' ')"
        fi
    fi
    stop_daemon slurmd
    stop_daemon slurmctld
    stop_daemon munged
    if pgrep -x slurmstepd >/dev/null; then
        log "warning: slurmstepd processes remain: $(pgrep -x slurmstepd | tr '\n' ' ')"
    fi
    log "stopped"
}

# --- main ----------------------------------------------------------------------
case ${1:-start} in
stop)
    stop_all
    exit 0
    ;;
install)
    install_packages
    exit 0
    ;;
start) ;;
*) die "usage: $0 [start|install|stop]" ;;
esac

started=$SECONDS
install_packages
install -d -m 0755 "$RUN_DIR"
start_munge
if write_conf; then
    # A changed configuration (other CPUs or memory) needs both daemons
    # restarted; scontrol reconfigure does not change a node's resources.
    if [[ -n $(pid_of slurmctld) || -n $(pid_of slurmd) ]]; then
        log "slurm.conf changed: restarting slurmctld and slurmd"
        stop_daemon slurmd
        stop_daemon slurmctld
    fi
fi
start_slurm
wait_ready
read -r cpus mem < <(sinfo -h -n "$NODE" -o '%c %m' | head -n 1)
echo "slurm ready: node $NODE, cpus $cpus, memory $mem MiB ($((SECONDS - started)) s)"
