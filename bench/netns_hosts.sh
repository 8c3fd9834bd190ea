#!/usr/bin/env bash
# Hosts for the broadcast workload of bench/compare_envelope.sh: network
# namespaces joined by veth pairs to one bridge in this namespace.
#
#   bench/netns_hosts.sh up N     makes rlbench-h1 .. rlbench-hN (addresses
#                                 10.210.0.2 .. 10.210.0.(N+1)/24) on the bridge
#                                 rlbench-br (10.210.0.1/24, this namespace)
#   bench/netns_hosts.sh down     ends every process left in those namespaces
#                                 (SIGKILL, by pid), deletes them and the bridge
#
# `up` first does what `down` does, so it always starts from nothing; `down`
# is idempotent. Only the bridge's subnet and each namespace's loopback are
# set up: no routes out, no forwarding, no NAT. Needs root, iproute2 and
# python3 (`up` checks that each host reaches the bridge).
set -euo pipefail

BRIDGE=rlbench-br
PREFIX=rlbench-h
SUBNET=10.210.0

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
    exit 2
}

# Our namespaces: every rlbench-hN that `ip netns list` shows.
namespaces() {
    ip netns list | awk -v p="$PREFIX" 'index($1, p) == 1 && substr($1, length(p) + 1) ~ /^[0-9]+$/ { print $1 }'
}

# kill_namespace NS: SIGKILLs the processes in NS until none is left (5 s at most).
kill_namespace() {
    local ns=$1 pids _
    for _ in $(seq 50); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [[ -z $pids ]] && return 0
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.1
    done
    log "processes still in $ns: $(ip netns pids "$ns" | tr '\n' ' ')"
}

down() {
    local ns
    for ns in $(namespaces); do
        kill_namespace "$ns"
        ip netns del "$ns"
    done
    if ip link show "$BRIDGE" > /dev/null 2>&1; then
        ip link del "$BRIDGE"
    fi
}

# add_host I: the namespace rlbench-hI at $SUBNET.(I+1), its veth pair
# rlbench-vI (bridge side) / eth0 (namespace side).
add_host() {
    local i=$1 ns="$PREFIX$1" link="rlbench-v$1" peer="rlbench-p$1"
    ip netns add "$ns"
    ip link add "$link" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
    ip -n "$ns" link set "$peer" name eth0
    ip link set "$link" master "$BRIDGE"
    ip link set "$link" up
    ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
}

# reachable NS IP: whether a TCP connect from NS to IP port 9 gets an answer
# (nothing listens there: a refusal is the answer) within 3 s.
reachable() {
    ip netns exec "$1" python3 -c '
import socket, sys
try:
    socket.create_connection((sys.argv[1], 9), timeout=3)
except ConnectionRefusedError:
    pass' "$2" 2> /dev/null
}

up() {
    local n=$1 i
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || usage
    down
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for i in $(seq "$n"); do
        add_host "$i"
    done
    for i in $(seq "$n"); do
        reachable "$PREFIX$i" "$SUBNET.1" || { log "$PREFIX$i cannot reach $SUBNET.1"; exit 1; }
    done
    log "up: $n hosts $PREFIX{1..$n} at $SUBNET.2-$((n + 1)) on $BRIDGE ($SUBNET.1)"
}

case "${1:-}" in
    up) [[ $# == 2 ]] || usage; up "$2" ;;
    down) [[ $# == 1 ]] || usage; down ;;
    *) usage ;;
esac
