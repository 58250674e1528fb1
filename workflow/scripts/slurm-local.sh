#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for testing the workflow's SLURM profile
# (workflow/profiles/slurm) without a site cluster. Works without systemd.
#
#   workflow/scripts/slurm-install.sh         # once: Debian packages (root)
#   workflow/scripts/slurm-local.sh start     # configure and start all daemons
#   workflow/scripts/slurm-local.sh status    # daemons, node state, recent jobs
#   workflow/scripts/slurm-local.sh stop      # stop the daemons this script started
#
# Daemons, in start order: munged (as user munge), mariadbd (bound to 127.0.0.1, holds the
# accounting database slurm_acct_db), slurmdbd, slurmctld, slurmd (node "localhost").
# Everything they write (configuration copies, logs, spool, database files, PIDs) lives in the
# state directory; the PID of every daemon started here is recorded there, and `stop` ends
# exactly those processes, in reverse order.
#
# The node is described with the machine's real CPU count and memory, plus fake GPUs
# (Gres=gpu:N, each backed by an empty file in the state directory) so that jobs asking for
# `--gpus=k` (k <= N) can be scheduled.
# Partitions: `cpu` (default) and `gpu`, both holding the one node.
#
# SLURM's clients (sbatch, sinfo, sacct, ...) read /etc/slurm/slurm.conf, so `start` writes
# the configuration there too; it refuses to overwrite a slurm.conf it did not write.
#
# Environment:
#   FLOORGAP_SLURM_STATE    state directory (default: <repo>/.slurm-local)
#   FLOORGAP_SLURM_DB_PORT  TCP port of the accounting database on 127.0.0.1 (default 3307)
#   FLOORGAP_SLURM_CLUSTER  cluster name (default floorgap)
#   FLOORGAP_SLURM_ACCOUNT  account that the current user is added to (default floorgap)
#   FLOORGAP_SLURM_TIMEOUT  seconds to wait for each daemon (default 60)
#   FLOORGAP_SLURM_GPUS     fake GPUs of the node (default 8, a GPU node of the paper's size:
#                           fewer make jobs that ask for several hold up the queue)
#   FLOORGAP_SLURM_MEMORY_MB  schedulable memory of the node (default 4x the machine's: the
#                           rehearsal's jobs ask for a GPU node's memory and use little)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
STATE=${FLOORGAP_SLURM_STATE:-$REPO_ROOT/.slurm-local}
DB_PORT=${FLOORGAP_SLURM_DB_PORT:-3307}
CLUSTER=${FLOORGAP_SLURM_CLUSTER:-floorgap}
ACCOUNT=${FLOORGAP_SLURM_ACCOUNT:-floorgap}
WAIT=${FLOORGAP_SLURM_TIMEOUT:-60}
GPUS=${FLOORGAP_SLURM_GPUS:-8}
MEMORY_MB=${FLOORGAP_SLURM_MEMORY_MB:-}
NODE=localhost
ETC=/etc/slurm
MARKER="# written by floorgap workflow/scripts/slurm-local.sh"
# Start order; `stop` walks it backwards.
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

log() { printf 'slurm-local: %s\n' "$*" >&2; }
die() { printf 'slurm-local: error: %s\n' "$*" >&2; exit 1; }

usage() {
    if [[ ${1:-0} -ne 0 ]]; then exec >&2; fi
    sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

# ---------------------------------------------------------------- PID bookkeeping

pidfile_of() { echo "$STATE/pids/$1.pid"; }

# PID recorded for daemon $1 if that process is still alive and is that program.
live_pid() {
    local f pid comm
    f=$(pidfile_of "$1")
    [[ -s $f ]] || return 1
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/comm ]] || return 1
    comm=$(<"/proc/$pid/comm")
    # /proc/PID/comm is cut at 15 characters.
    [[ $comm == "${1:0:15}" ]] || return 1
    # An exited process waiting to be reaped does not count.
    is_zombie "$pid" && return 1
    echo "$pid"
}

is_zombie() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} == Z ]]
}

record_pid() { mkdir -p "$STATE/pids"; echo "$2" >"$(pidfile_of "$1")"; }

# Wait until the PID file a daemon writes itself appears and names a live process of that
# program, then record the PID.
adopt_pidfile() {
    local name=$1 file=$2 i pid
    for ((i = 0; i < WAIT * 10; i++)); do
        if [[ -s $file ]]; then
            pid=$(tr -dc '0-9' <"$file")
            if [[ -n $pid ]]; then
                record_pid "$name" "$pid"
                live_pid "$name" >/dev/null && return 0
            fi
        fi
        sleep 0.1
    done
    return 1
}

# Poll a command until it succeeds or WAIT seconds pass.
wait_for() {
    local what=$1 i
    shift
    for ((i = 0; i < WAIT * 4; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.25
    done
    log "timed out after ${WAIT}s waiting for $what"
    return 1
}

show_log() {
    local f=$1
    if [[ -f $f ]]; then
        log "last lines of $f:"
        tail -n 25 "$f" >&2 || true
    fi
}

# ---------------------------------------------------------------- checks

# Live processes running program $1 other than the one recorded here.
foreign_pids() {
    local name=$1 own p pid out=()
    own=$(live_pid "$name" || true)
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [[ $pid == "$own" ]] && continue
        [[ $(cat "$p/comm" 2>/dev/null) == "${name:0:15}" ]] || continue
        is_zombie "$pid" && continue
        out+=("$pid")
    done
    echo "${out[*]}"
}

# SLURM daemons from elsewhere (a system service, another state directory) would hold the ports.
check_no_foreign_daemons() {
    local name pids
    for name in slurmdbd slurmctld slurmd; do
        pids=$(foreign_pids "$name")
        if [[ -n $pids ]]; then
            die "a $name not started from $STATE is running (pid $pids); stop it first"
        fi
    done
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (the daemons switch users and bind ports)"
}

need_commands() {
    local missing=() c
    for c in munged munge unmunge mariadbd mariadb mariadb-install-db mariadb-admin \
        slurmdbd slurmctld slurmd sacctmgr sinfo scontrol sacct sbatch runuser; do
        command -v "$c" >/dev/null 2>&1 || missing+=("$c")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        die "missing commands: ${missing[*]}; install them with $SCRIPT_DIR/slurm-install.sh"
    fi
}

check_state_path() {
    [[ $STATE != *[[:space:]]* ]] || die "state directory must not contain spaces: $STATE"
}

# The configuration files under /etc/slurm must be ours (or absent).
check_etc_ours() {
    local f
    for f in "$ETC/slurm.conf" "$ETC/slurmdbd.conf" "$ETC/gres.conf"; do
        if [[ -e $f ]] && ! grep -qF "$MARKER" "$f"; then
            die "$f exists and was not written by this script; refusing to overwrite it"
        fi
    done
}

# ---------------------------------------------------------------- configuration

write_configs() {
    local node_line cpus mem
    # `slurmd -C` prints the hardware as SLURM sees it: CPUs, sockets, cores, threads, memory.
    node_line=$(slurmd -C | head -n 1) || die "slurmd -C failed"
    [[ $node_line == NodeName=* ]] || die "unexpected output of slurmd -C: $node_line"
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
    mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
    [[ -n $cpus && -n $mem ]] || die "could not read CPUs/RealMemory from: $node_line"
    # Describe the node as found, renamed to "localhost" (slurmd runs with -N localhost), with
    # MEMORY_MB of schedulable memory: the paper configs' jobs ask for what a GPU node has, and
    # their stand-ins use a small part of it (slurmd accepts the figure: config_overrides).
    node_line="NodeName=$NODE NodeAddr=127.0.0.1 ${node_line#NodeName=* }"
    node_line=${node_line/RealMemory=$mem/RealMemory=${MEMORY_MB:-$((mem * 4))}}

    mkdir -p "$ETC" "$STATE/conf"

    cat >"$STATE/conf/slurm.conf" <<EOF
$MARKER
# One-node test cluster; see the script for how to start and stop it.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
SwitchType=switch/none
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# A job without --mem would otherwise take the whole node.
DefMemPerCPU=1000
# Keep finished jobs visible to squeue for a while (status checks may use it).
MinJobAge=600
KillWait=10
InactiveLimit=0
Waittime=0
SlurmctldTimeout=120
SlurmdTimeout=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
# sacct shows the Snakemake rule of each job (the executor writes it as the comment)
AccountingStoreFlags=job_comment
GresTypes=gpu
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
$node_line Gres=gpu:$GPUS State=UNKNOWN
PartitionName=cpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$NODE Default=NO MaxTime=INFINITE State=UP
EOF

    cat >"$STATE/conf/gres.conf" <<EOF
$MARKER
# Fake GPUs: without a File the node is marked INVAL.
NodeName=$NODE Name=gpu File=$STATE/fake-gpu[0-$((GPUS - 1))]
EOF
    for ((i = 0; i < GPUS; i++)); do : >"$STATE/fake-gpu$i"; done

    cat >"$STATE/conf/slurmdbd.conf" <<EOF
$MARKER
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
DebugLevel=info
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(db_password)
StorageLoc=slurm_acct_db
EOF

    install -m 0644 "$STATE/conf/slurm.conf" "$ETC/slurm.conf"
    install -m 0644 "$STATE/conf/gres.conf" "$ETC/gres.conf"
    install -m 0600 "$STATE/conf/slurmdbd.conf" "$ETC/slurmdbd.conf"
    chmod 0600 "$STATE/conf/slurmdbd.conf"
    log "node: $node_line Gres=gpu:$GPUS"
}

db_password() {
    local f="$STATE/conf/db-password"
    if [[ ! -s $f ]]; then
        mkdir -p "$STATE/conf"
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$f")
    fi
    cat "$f"
}

# ---------------------------------------------------------------- daemons

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munged() {
    if live_pid munged >/dev/null; then log "munged already running"; return; fi
    if munge_works; then
        # A munged that this script did not start (e.g. a system service): use it, never stop it.
        log "using an already running munged"
        rm -f "$(pidfile_of munged)"
        return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 0700 /etc/munge
    chmod 0400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    rm -f /run/munge/munged.pid
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid \
        || { show_log /var/log/munge/munged.log; die "munged failed to start"; }
    adopt_pidfile munged /run/munge/munged.pid \
        || { show_log /var/log/munge/munged.log; die "munged did not write its PID file"; }
    wait_for "munge to answer" munge_works || die "munge does not work"
    log "munged started (pid $(live_pid munged))"
}

db_sock() { echo "$STATE/run/mysqld.sock"; }
db() { mariadb --no-defaults --protocol=socket --socket="$(db_sock)" -u root "$@"; }

start_mariadbd() {
    local datadir="$STATE/mysql" pid
    if live_pid mariadbd >/dev/null; then
        log "mariadbd already running"
    else
        if port_in_use "$DB_PORT"; then
            die "port $DB_PORT on 127.0.0.1 is in use; set FLOORGAP_SLURM_DB_PORT to a free port"
        fi
        if [[ ! -d $datadir/mysql ]]; then
            log "initialising the accounting database in $datadir"
            rm -rf "$datadir"
            mkdir -p "$datadir"
            mariadb-install-db --no-defaults --user=root --datadir="$datadir" \
                --auth-root-authentication-method=socket --skip-test-db \
                >"$STATE/log/mariadb-install.log" 2>&1 \
                || { show_log "$STATE/log/mariadb-install.log"; die "mariadb-install-db failed"; }
        fi
        rm -f "$(db_sock)"
        # Runs in the foreground of its own session; $! is mariadbd itself.
        setsid mariadbd --no-defaults --user=root --datadir="$datadir" \
            --socket="$(db_sock)" --pid-file="$STATE/run/mariadbd.pid" \
            --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve \
            --log-error="$STATE/log/mariadbd.log" \
            </dev/null >>"$STATE/log/mariadbd.out" 2>&1 &
        pid=$!
        record_pid mariadbd "$pid"
        if ! wait_for "mariadbd" db -e 'SELECT 1'; then
            show_log "$STATE/log/mariadbd.log"
            die "mariadbd did not come up"
        fi
        live_pid mariadbd >/dev/null || { show_log "$STATE/log/mariadbd.log"; die "mariadbd exited"; }
        log "mariadbd started (pid $pid, 127.0.0.1:$DB_PORT)"
    fi
    local pw
    pw=$(db_password)
    db <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
}

port_in_use() {
    # Something already accepting on 127.0.0.1:$1?
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

sacctmgr_t() { timeout 20 sacctmgr "$@"; }

start_slurmdbd() {
    if live_pid slurmdbd >/dev/null; then
        log "slurmdbd already running"
    else
        rm -f "$STATE/run/slurmdbd.pid"
        slurmdbd || { show_log "$STATE/log/slurmdbd.log"; die "slurmdbd failed to start"; }
        adopt_pidfile slurmdbd "$STATE/run/slurmdbd.pid" \
            || { show_log "$STATE/log/slurmdbd.log"; die "slurmdbd did not write its PID file"; }
        log "slurmdbd started (pid $(live_pid slurmdbd))"
    fi
    wait_for "slurmdbd to answer" sacctmgr_t -n -P show cluster \
        || { show_log "$STATE/log/slurmdbd.log"; die "slurmdbd does not answer"; }
}

# Add cluster, account and the current user to the accounting database (once).
add_associations() {
    local user
    user=$(id -un)
    if [[ -z $(sacctmgr_t -n -P show cluster "$CLUSTER" format=cluster) ]]; then
        sacctmgr_t -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed"
    fi
    if [[ -z $(sacctmgr_t -n -P show account "$ACCOUNT" format=account) ]]; then
        sacctmgr_t -i add account "$ACCOUNT" Cluster="$CLUSTER" \
            Description="floorgap test account" Organization=floorgap >/dev/null \
            || die "sacctmgr add account failed"
    fi
    if [[ -z $(sacctmgr_t -n -P show assoc where user="$user" account="$ACCOUNT" \
        cluster="$CLUSTER" format=user) ]]; then
        sacctmgr_t -i add user "$user" Account="$ACCOUNT" Cluster="$CLUSTER" \
            DefaultAccount="$ACCOUNT" >/dev/null || die "sacctmgr add user $user failed"
    fi
    log "accounting: cluster $CLUSTER, account $ACCOUNT, user $user"
}

start_slurmctld() {
    if live_pid slurmctld >/dev/null; then log "slurmctld already running"; return; fi
    rm -f "$STATE/run/slurmctld.pid"
    slurmctld || { show_log "$STATE/log/slurmctld.log"; die "slurmctld failed to start"; }
    adopt_pidfile slurmctld "$STATE/run/slurmctld.pid" \
        || { show_log "$STATE/log/slurmctld.log"; die "slurmctld did not write its PID file"; }
    wait_for "slurmctld to answer" timeout 10 scontrol ping \
        || { show_log "$STATE/log/slurmctld.log"; die "slurmctld does not answer"; }
    log "slurmctld started (pid $(live_pid slurmctld))"
}

start_slurmd() {
    if live_pid slurmd >/dev/null; then log "slurmd already running"; return; fi
    rm -f "$STATE/run/slurmd.pid"
    slurmd -N "$NODE" || { show_log "$STATE/log/slurmd.log"; die "slurmd failed to start"; }
    adopt_pidfile slurmd "$STATE/run/slurmd.pid" \
        || { show_log "$STATE/log/slurmd.log"; die "slurmd did not write its PID file"; }
    log "slurmd started (pid $(live_pid slurmd))"
}

node_state() { timeout 10 sinfo -h -n "$NODE" -o '%T' 2>/dev/null | head -n 1; }

wait_node_idle() {
    local i state=""
    for ((i = 0; i < WAIT * 2; i++)); do
        state=$(node_state || true)
        case $state in
            idle | mixed | allocated) log "node $NODE is $state"; return 0 ;;
            down* | drain* | inval*)
                # A node left down by an earlier run; bring it back.
                timeout 10 scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
                ;;
        esac
        sleep 0.5
    done
    timeout 10 scontrol show node "$NODE" >&2 || true
    show_log "$STATE/log/slurmd.log"
    show_log "$STATE/log/slurmctld.log"
    die "node $NODE did not become idle (state: ${state:-unknown})"
}

# ---------------------------------------------------------------- commands

cmd_start() {
    need_root
    need_commands
    check_state_path
    check_etc_ours
    check_no_foreign_daemons
    mkdir -p "$STATE"/{pids,run,log,conf,slurmctld,slurmd}
    local t0=$SECONDS
    write_configs
    start_munged
    start_mariadbd
    start_slurmdbd
    add_associations
    start_slurmctld
    start_slurmd
    wait_node_idle
    log "cluster $CLUSTER is up in $((SECONDS - t0)) s; state in $STATE"
}

# Send TERM to a recorded daemon, wait for it to exit, KILL it if it does not.
stop_one() {
    local name=$1 pid i
    if ! pid=$(live_pid "$name"); then
        rm -f "$(pidfile_of "$name")"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < WAIT * 10; i++)); do
        # Gone, or exited and waiting to be reaped by its parent.
        [[ -d /proc/$pid ]] || break
        is_zombie "$pid" && break
        sleep 0.1
    done
    if [[ -d /proc/$pid ]] && ! is_zombie "$pid"; then
        log "$name (pid $pid) did not exit after TERM within ${WAIT}s; sending KILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            [[ -d /proc/$pid ]] || break
            is_zombie "$pid" && break
            sleep 0.1
        done
    fi
    rm -f "$(pidfile_of "$name")"
    log "stopped $name (pid $pid)"
}

# Cancel every job still queued or running, so no job step outlives the daemons.
cancel_jobs() {
    local ids i
    ids=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ') || return 0
    [[ -n ${ids// /} ]] || return 0
    log "cancelling jobs: $ids"
    # shellcheck disable=SC2086
    timeout 10 scancel $ids >/dev/null 2>&1 || true
    for ((i = 0; i < 60; i++)); do
        [[ -z $(timeout 10 squeue -h -o %i 2>/dev/null) ]] && return 0
        sleep 0.5
    done
    log "jobs still listed after scancel: $(timeout 10 squeue -h -o '%i %T' | tr '\n' ' ')"
}

cmd_stop() {
    need_root
    local i rc=0
    if live_pid slurmctld >/dev/null && live_pid slurmd >/dev/null; then cancel_jobs; fi
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        stop_one "${DAEMONS[i]}" || rc=1
    done
    for i in "${DAEMONS[@]}"; do
        if live_pid "$i" >/dev/null; then log "$i is still running"; rc=1; fi
    done
    return $rc
}

cmd_status() {
    local name pid up=0 total=0
    for name in "${DAEMONS[@]}"; do
        if pid=$(live_pid "$name"); then
            printf '%-10s running (pid %s)\n' "$name" "$pid"
            up=$((up + 1))
        else
            printf '%-10s not running\n' "$name"
        fi
        total=$((total + 1))
    done
    if live_pid slurmctld >/dev/null; then
        timeout 10 sinfo -N -o '%N %P %T %c %m %G' || true
        timeout 10 squeue || true
    fi
    [[ $up -eq $total ]]
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status) cmd_status ;;
    -h | --help | help) usage 0 ;;
    *) usage 1 ;;
esac
