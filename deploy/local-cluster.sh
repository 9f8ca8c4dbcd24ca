#!/usr/bin/env bash
# Starts or stops a cluster of sluiced nodes on loopback, for trying the cluster out.
#
#   deploy/local-cluster.sh start [N]     N nodes (default 3), in the background
#   deploy/local-cluster.sh status        sluicectl status of node 1 (members, ring shares)
#   deploy/local-cluster.sh stop          SIGTERM to every node (each leaves and hands off)
#
# Node i (1-based) listens on 127.0.0.1: checks (UDP and TCP) 7350+10*(i-1), admin 7351+10*(i-1),
# peers 7352+10*(i-1), gRPC 7353+10*(i-1), RESP (Redis protocol) 7354+10*(i-1); node 1 is every
# other node's seed. Configs, data directories and logs go under $SLUICE_CLUSTER_DIR (default
# ./local-cluster). Rules: $SLUICE_RULES (default: the embedded example rules). Set SLUICE_BASE_PORT to move every port.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="${SLUICE_BIN_DIR:-$here/build/daemon}"
dir=${SLUICE_CLUSTER_DIR:-$PWD/local-cluster}
base=${SLUICE_BASE_PORT:-7350}
cmd=${1:-}

port_of() { echo $((base + 10 * ($1 - 1) + $2)); }

start() {
  local n=${1:-3}
  if ! [[ "$n" =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 50 ]; then
    echo "local-cluster: N must be 1..50" >&2
    exit 2
  fi
  if [ -e "$dir/pids" ]; then
    echo "local-cluster: $dir/pids exists: a cluster may be running (stop it first)" >&2
    exit 2
  fi
  mkdir -p "$dir"
  # One secret for the whole cluster; the same one on every node.
  [ -s "$dir/secret" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
  : >"$dir/pids"
  for i in $(seq 1 "$n"); do
    local cfg="$dir/node-$i.yaml"
    {
      echo "udp: 127.0.0.1:$(port_of "$i" 0)"
      echo "tcp: 127.0.0.1:$(port_of "$i" 0)"
      echo "admin: 127.0.0.1:$(port_of "$i" 1)"
      echo "grpc: 127.0.0.1:$(port_of "$i" 3)"
      echo "resp: 127.0.0.1:$(port_of "$i" 4)"
      echo "threads: 1"
      echo "data_dir: $dir/data-$i"
      echo "init_data: true"
      [ -n "${SLUICE_RULES:-}" ] && echo "rules: $SLUICE_RULES"
      echo "cluster:"
      echo "  node_id: $i"
      echo "  name: node-$i"
      echo "  listen: 127.0.0.1:$(port_of "$i" 2)"
      echo "  secret_file: $dir/secret"
      [ "$i" -gt 1 ] && echo "  seeds: [127.0.0.1:$(port_of 1 2)]"
    } >"$cfg"
    "$bin/sluiced" --config "$cfg" >"$dir/node-$i.log" 2>&1 &
    echo "$!" >>"$dir/pids"
  done
  # Ready when every node answers /healthz (bounded: 10 s).
  local down=""
  for i in $(seq 1 "$n"); do
    local up=0 pid
    pid=$(sed -n "${i}p" "$dir/pids")
    for _ in $(seq 1 100); do
      if "$bin/sluicectl" status --admin "127.0.0.1:$(port_of "$i" 1)" >/dev/null 2>&1; then
        up=1
        break
      fi
      kill -0 "$pid" 2>/dev/null || break  # it exited: no use waiting
      sleep 0.1
    done
    [ "$up" = 1 ] || down="$down $i"
  done
  if [ -n "$down" ]; then
    # Say which nodes did not come up and why (their logs), and leave nothing half-started.
    for i in $down; do
      echo "local-cluster: node $i is not up (exited, or no answer within 10 s); the end of $dir/node-$i.log:" >&2
      tail -n 5 "$dir/node-$i.log" >&2 || true
    done
    stop >/dev/null
    exit 1
  fi
  echo "local-cluster: $n nodes up; checks on 127.0.0.1:$(port_of 1 0).., admin 127.0.0.1:$(port_of 1 1).. (logs in $dir)"
}

stop() {
  [ -e "$dir/pids" ] || { echo "local-cluster: nothing to stop in $dir"; return 0; }
  while read -r pid; do kill -TERM "$pid" 2>/dev/null || true; done <"$dir/pids"
  while read -r pid; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done <"$dir/pids"
  rm -f "$dir/pids"
  echo "local-cluster: stopped"
}

case "$cmd" in
  start) start "${2:-3}" ;;
  stop) stop ;;
  status) "$bin/sluicectl" status --admin "127.0.0.1:$(port_of 1 1)" ;;
  *)
    echo "usage: deploy/local-cluster.sh start [N] | status | stop" >&2
    exit 2
    ;;
esac
