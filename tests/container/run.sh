#!/usr/bin/env bash
# The container image (ctest container_cluster, label `container`): built by
# deploy/container/build.sh from this build tree (no registry, no base image), its size printed,
# then a cluster of three containers under podman on a network of their own: each finds the others
# through the seed list, runs as the non-root user, passes the image's health check, and answers
# checks of one key in one count through every node (owner mode: 2999, 2998, 2997 left).
#
#   tests/container/run.sh BUILD_DIR
#
# Needs root (prints SKIPPED otherwise). podman runs with runc and explicit ulimits: crun and the
# default rlimits fail on this machine's cgroup layout. Without systemd on the host podman cannot
# schedule health checks itself (it says so on stderr, kept in a log): the test runs them.
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
fail() { echo "FAILED: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
[ "$(id -u)" -eq 0 ] || { echo "SKIPPED: needs root (podman with a bridge network)"; exit 0; }
for tool in podman buildah python3; do
  command -v "$tool" >/dev/null || fail "$tool not found (deploy/setup.sh installs what is needed)"
done
sluicectl="$build/daemon/sluicectl"

id=$$
tag="localhost/sluice-test:$id"
net="sluice-test-$id"
work=$(mktemp -d)
names=()
cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    for n in "${names[@]}"; do echo "--- podman logs $n" >&2; podman logs "$n" 2>&1 | tail -n 10 >&2 || true; done
  fi
  for n in "${names[@]}"; do podman rm -f -t 5 "$n" >/dev/null 2>&1 || true; done
  podman network rm -f "$net" >/dev/null 2>&1 || true
  podman rmi -f "$tag" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

"$src/deploy/container/build.sh" "$build" "$tag" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "deploy/container/build.sh"; }
size=$(podman image inspect --format '{{.Size}}' "$tag")
ok "image $tag built: $size bytes ($((size / 1024 / 1024)) MiB)"
[ "$(podman image inspect --format '{{.Config.User}}' "$tag")" = 65532:65532 ] || fail "the image's user is not 65532"

# A subnet no other network of this machine uses.
subnet=""
for _ in $(seq 1 20); do
  s="10.$((RANDOM % 150 + 100)).$((RANDOM % 250)).0/24"
  if podman network create --subnet "$s" "$net" >/dev/null 2>&1; then subnet=$s; break; fi
done
[ -n "$subnet" ] || fail "podman network create found no free subnet"
prefix=${subnet%.0/24}
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
chmod 0644 "$work/secret"  # read by uid 65532 in the container; the directory is private to root here
for i in 1 2 3; do
  ip="$prefix.$((10 + i))"
  cat >"$work/node-$i.yaml" <<YAML
udp: 0.0.0.0:7350
tcp: 0.0.0.0:7350
admin: 0.0.0.0:7351
grpc: ""
resp: ""
threads: 1
rules: /etc/sluice/rules.yaml
data_dir: /var/lib/sluice/data
init_data: true
cluster:
  node_id: $i
  name: node-$i
  listen: 0.0.0.0:7352
  advertise: $ip
  seeds: [$prefix.11:7352]
  secret_file: /etc/sluice/secret
YAML
  chmod 0644 "$work/node-$i.yaml"
  name="sluice-test-$id-$i"
  names+=("$name")
  podman run --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 -d --name "$name" \
    --network "$net" --ip "$ip" \
    -v "$work/node-$i.yaml:/etc/sluice/sluiced.yaml:ro" -v "$work/secret:/etc/sluice/secret:ro" \
    "$tag" >/dev/null 2>>"$work/podman.log" || { cat "$work/podman.log" >&2; fail "podman run $name"; }
done
chmod 0755 "$work"
ok "three containers started on $subnet"

members() {  # alive members node $1 knows, by its /v1/status
  "$sluicectl" status --admin "$prefix.$((10 + $1)):7351" --json 2>/dev/null | python3 -c '
import json, sys
status = json.loads(sys.stdin.readline())
print(sum(1 for m in status.get("cluster", {}).get("members", []) if m.get("state") == "alive"))' 2>/dev/null || echo 0
}
for i in 1 2 3; do
  n=0
  for _ in $(seq 1 300); do
    n=$(members "$i")
    [ "$n" = 3 ] && break
    sleep 0.1
  done
  [ "$n" = 3 ] || fail "node $i knows $n alive members after 30 s, not 3"
done
ok "every node knows the three members (seed list)"

for i in 1 2 3; do
  podman healthcheck run "sluice-test-$id-$i" >/dev/null 2>&1 || fail "node $i's health check failed"
  [ "$(podman exec "sluice-test-$id-$i" /bin/sh -c 'id -u' 2>/dev/null || podman exec "sluice-test-$id-$i" /bin/busybox id -u)" = 65532 ] ||
    fail "node $i does not run as uid 65532"
done
ok "each container is healthy by the image's health check and runs as uid 65532"

want=2999
for i in 1 2 3; do
  left=$("$sluicectl" check api "api_key=one-key-$id" --server "$prefix.$((10 + i)):7350" --json |
    python3 -c '
import json, sys
answer = json.loads(sys.stdin.readline())
print(next(l["remaining"] for l in answer["limits"] if l["name"] == "per-10-minutes"))')
  [ "$left" = "$want" ] || fail "a check through node $i left $left, want $want (one count through every node)"
  want=$((want - 1))
done
ok "checks of one key through each node were counted once, in one count (2999, 2998, 2997)"

# A container told to join a cluster without its secret refuses to start, and says why.
sed '/secret_file/d' "$work/node-1.yaml" >"$work/no-secret.yaml"
chmod 0644 "$work/no-secret.yaml"
names+=("sluice-test-$id-nosecret")
podman run --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 --name "sluice-test-$id-nosecret" \
  --network "$net" -v "$work/no-secret.yaml:/etc/sluice/sluiced.yaml:ro" "$tag" >"$work/nosecret.log" 2>&1 &&
  fail "a container with a cluster and no secret started"
grep -q "cluster.secret: is required" "$work/nosecret.log" ||
  fail "the container without a secret did not say why: $(tail -n 3 "$work/nosecret.log")"
ok "a container with a cluster and no secret refuses to start: $(grep -o 'cluster.secret: is required[^(]*' "$work/nosecret.log" | head -1)"
