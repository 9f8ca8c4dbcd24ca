#!/usr/bin/env bash
# Brings a fresh Debian 12 machine (root, nothing prepared) to a built Sluice tree in build/.
# Idempotent: packages already installed (asked with dpkg -s) are not touched, and apt-get update
# and install run only when something is missing. Non-interactive throughout. Then the npm packages
# of the Node tests (tests/interop/node, tests/interop/resp/node, tests/ui, tests/k8s), again only
# when missing or their lockfile changed.
#
#   deploy/setup.sh            install what is missing, then configure and build Release in build/
#   SLUICE_SKIP_BUILD=1 ...    install only
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Every package the project builds, tests or benchmarks with. Why each library is here is in
# README.md ("Dependencies").
packages=(
  build-essential cmake ninja-build pkg-config git
  ccache                  # compiler cache (~/.cache/ccache): repeat builds and fresh clones are cheap
  libboost-dev            # Asio and Beast (header-only in 1.74)
  capnproto libcapnp-dev  # wire schemas and serialization
  librocksdb-dev          # counter snapshots, persisted overrides
  libspdlog-dev libfmt-dev
  doctest-dev
  libyaml-cpp-dev         # the rules file
  libxxhash-dev           # key hashing (XXH3)
  libcli11-dev            # command-line parsing for sluiced, sluicectl and the benchmarks
  nlohmann-json3-dev      # JSON for the HTTP check endpoint and `--json` output
  libssl-dev              # HMAC for peer messages
  clang libclang-rt-14-dev  # libFuzzer targets
  clang-format            # the code style, checked in CI (tests/check_format.sh)
  redis-server memcached nginx  # baselines for bench/ and the nginx auth_request test
  redis-tools             # redis-cli, redis-benchmark: the RESP door's tests and bench rows
  # Redis clients no one here wrote, each against the RESP door (tests/interop/resp): redis-py
  # (run by /usr/bin/python3), hiredis (a C test), redis-rb. The Node ones come from npm.
  python3-redis libhiredis-dev ruby-redis
  procps iproute2 curl python3
  jq                      # bench/interleave.sh reads the engine rows of --json
  nftables                # partition faults in tests/cluster/partition_test.cc and the bench
  dnsmasq-base            # a real DNS server for the DNS seed tests (the binary only, no service)
  # The gRPC front (lib/rls): find_package(gRPC CONFIG) needs all four together. protoc also
  # builds the Python interop test's message descriptors.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  python3-grpcio          # the Python RLS interop test (tests/interop/python), run by /usr/bin/python3
  python3-pytest          # runs that test
  libnghttp2-dev          # HTTP/2 for the gRPC front (lib/rls) and the benchmark's gRPC generator
  nghttp2-client          # nghttp: raw HTTP/2 gRPC calls with a chosen grpc-timeout (interop tests)
  nodejs                  # the Node RLS interop test (tests/interop/node, node's own test runner)
  # The Debian package and its unit (deploy/package, deploy/systemd): cpack's DEB generator asks
  # dpkg-shlibdeps (dpkg-dev) and file for the Depends; adduser for the package's user;
  # systemd-analyze (systemd) checks the unit in CI.
  dpkg-dev file adduser systemd
  chromium                # the dashboard's browser test (tests/ui): playwright-core drives it
  golang-go               # the Go client (clients/go): cgo over libsluice.so, `go test -race` in CI
  prometheus              # promtool: the alert and recording rules' unit tests (deploy/prometheus)
  debootstrap systemd-container  # the package under a real systemd (tests/systemd): a Debian 12 root booted by nspawn
  podman buildah runc busybox-static  # the container image (deploy/container) and its 3-node test
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg -s "$p" >/dev/null 2>&1; then missing+=("$p"); fi
done
# npm: Debian ships it as a package of its own; other builds of nodejs bring it along (and conflict
# with Debian's), so ask for the command, not the package.
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  # Servers installed here (redis, memcached, nginx) are only started by the tests and benchmarks
  # themselves, on free loopback ports; keep their packages from starting system-wide copies.
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod +x "$policy"
    made_policy=1
  fi
  trap '[ "$made_policy" = 1 ] && $sudo rm -f "$policy"' EXIT
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages already installed"
fi

# The Node tests' packages, exactly as their lockfiles pin them; only when node_modules is missing
# or the lockfile changed since the last install (deploy/npm-ci.sh; the test scripts do the same
# before they run). playwright-core (tests/ui) downloads no browser: it drives Debian's chromium.
for node_dir in tests/interop/node tests/interop/resp/node tests/ui tests/k8s; do
  "$here/deploy/npm-ci.sh" "$here/$node_dir"
done

if [ "${SLUICE_SKIP_BUILD:-0}" = 1 ]; then exit 0; fi

jobs=${SLUICE_JOBS:-2}
cmake -S "$here" -B "$here/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$here/build" -j "$jobs"
