#!/usr/bin/env bash
# Builds a previous release's sluiced from this clone's git history, once, into a cache outside
# the clone, and prints the binary's path. Later runs find it there and take no time.
#   tests/upgrade/build_release.sh <commit> [cache root]
# The cache root is $SLUICE_RELEASE_CACHE, else /var/cache/sluice-test/releases (when writable),
# else ~/.cache/sluice-test/releases. The source is `git archive` of the commit (no work tree, no
# tags needed), configured without tests or benchmarks and built with ccache, -j2: only sluiced.
set -euo pipefail
commit_arg=${1:?usage: build_release.sh <commit> [cache root]}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse --verify "${commit_arg}^{commit}")

root=${2:-${SLUICE_RELEASE_CACHE:-}}
if [ -z "$root" ]; then
  root=/var/cache/sluice-test/releases
  if ! mkdir -p "$root" 2>/dev/null || [ ! -w "$root" ]; then root=$HOME/.cache/sluice-test/releases; fi
fi
dir=$root/$commit
bin=$dir/build/daemon/sluiced
if [ -x "$bin" ] && [ -f "$dir/built" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$root"
# One builder at a time per commit: a second run waits, then finds the binary.
exec 9>"$root/$commit.lock"
flock 9
if [ -x "$bin" ] && [ -f "$dir/built" ]; then
  echo "$bin"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir/src"
git -C "$repo" archive --format=tar "$commit" | tar -x -C "$dir/src"
launcher=()
if command -v ccache >/dev/null; then
  # Hash paths relative to the source tree, as the current CMakeLists does, so that a rebuild of
  # the same release in another cache directory hits.
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="env;CCACHE_BASEDIR=$dir/src;CCACHE_NOHASHDIR=1;ccache"
            -DCMAKE_C_COMPILER_LAUNCHER="env;CCACHE_BASEDIR=$dir/src;CCACHE_NOHASHDIR=1;ccache")
fi
{
  cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCH=OFF "${launcher[@]}"
  cmake --build "$dir/build" --target sluiced -j2
} >"$dir/build.log" 2>&1 || {
  echo "building $commit failed; the last lines of $dir/build.log:" >&2
  tail -30 "$dir/build.log" >&2
  exit 1
}
touch "$dir/built"
echo "$bin"
