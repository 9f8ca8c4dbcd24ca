#!/usr/bin/env bash
# sluiced under a real systemd (ctest systemd_boot, label `systemd`): Debian 12 booted with
# systemd as PID 1 in a container (systemd-nspawn --boot, its own network namespace), the built
# .deb installed in it, and then what an operator relies on:
#   - `systemctl start sluiced` returns only once sluiced is ready (Type=notify): a check answers
#     at once;
#   - `systemctl reload sluiced` applies new rules and keeps the counts;
#   - kill -9 of sluiced is followed by a restart (Restart=on-failure) with the counts restored;
#   - the hardening holds at run time: sluiced's own view of the file system lets it write its
#     state directory and nothing else; `systemd-analyze security` on the running unit <= 2.0;
#   - the journal holds sluiced's start, reload and stop lines; `systemctl stop` drains and
#     ends with success.
#
#   tests/systemd/run.sh BUILD_DIR
#
# The container's root file system is made once by debootstrap (Debian 12 minbase, systemd and
# the package's dependencies) and cached in $SLUICE_TEST_CACHE (default /var/cache/sluice-test),
# outside the clone: the first run takes about a minute more, later runs seconds. The container
# runs on an overlay (--volatile=overlay), so the cached tree is never changed. Needs root
# (prints SKIPPED otherwise); a machine where nspawn cannot boot fails with nspawn's own output.
set -euo pipefail

build=$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)
cache=${SLUICE_TEST_CACHE:-/var/cache/sluice-test}
checks=0
fail() { echo "FAILED: $*" >&2; exit 1; }
ok() { checks=$((checks + 1)); echo "ok: $*"; }

[ "$(id -u)" -eq 0 ] || { echo "SKIPPED: needs root (systemd-nspawn, debootstrap)"; exit 0; }
for tool in systemd-nspawn debootstrap nsenter cpack dpkg-deb python3; do
  command -v "$tool" >/dev/null || fail "$tool not found (deploy/setup.sh installs what is needed)"
done
[ -f "$build/CPackConfig.cmake" ] || fail "$build/CPackConfig.cmake missing: configure the build first"

work=$(mktemp -d)
nspawn_pid=""
cleanup() {
  local rc=$?
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    kill -TERM "$nspawn_pid" 2>/dev/null || true  # nspawn powers the container off on SIGTERM
    for _ in $(seq 1 100); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
  fi
  if [ "$rc" -ne 0 ] && [ -f "$work/nspawn.log" ]; then
    echo "--- the container's console (last 30 lines)" >&2
    tail -n 30 "$work/nspawn.log" >&2
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

# ---- the package -----------------------------------------------------------------------------
if ! cpack --config "$build/CPackConfig.cmake" -B "$work/deb" >"$work/cpack.log" 2>&1; then
  cat "$work/cpack.log" >&2
  fail "cpack did not build the package"
fi
deb=$(ls "$work"/deb/sluice_*_amd64.deb)
ok "package built: $(basename "$deb")"

# ---- the root file system, cached by the package's dependencies --------------------------------
# The package's Depends as real packages: debootstrap cannot pick a provider for a virtual one
# (libspdlog1.10-fmt9 is provided by libspdlog1.10), so ask apt-cache for it.
real_package() {
  if [ -n "$(apt-cache show "$1" 2>/dev/null | head -n 1)" ]; then
    echo "$1"
  else
    apt-cache showpkg "$1" | sed -n '/^Reverse Provides:/{n;p}' | awk '{print $1}'
  fi
}
deps=$(for d in $(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed -e 's/(.*)//' -e 's/|.*//' -e 's/ //g'); do
  real_package "$d"
done | grep -v '^$' | sort -u | paste -sd, -)
key=$(printf '%s' "$deps" | sha1sum | cut -c1-12)
rootfs="$cache/rootfs-bookworm-$key"
mkdir -p "$cache"
(
  flock 9
  if [ ! -d "$rootfs" ]; then
    echo "making $rootfs with debootstrap (once; about a minute)"
    rm -rf "$rootfs.tmp"
    if ! debootstrap --variant=minbase \
      --include="systemd,systemd-sysv,dbus,procps,iproute2,$deps" bookworm "$rootfs.tmp" \
      >"$work/debootstrap.log" 2>&1; then
      tail -n 20 "$work/debootstrap.log" >&2
      fail "debootstrap could not make the root file system"
    fi
    mv "$rootfs.tmp" "$rootfs"
  fi
) 9>"$cache/lock"
ok "root file system: $rootfs"

# ---- boot ---------------------------------------------------------------------------------------
systemd-nspawn --boot --register=no --keep-unit --volatile=overlay --private-network \
  --machine="sluice-test-$$" -D "$rootfs" --bind-ro="$deb:/root/sluice.deb" \
  >"$work/nspawn.log" 2>&1 </dev/null &
nspawn_pid=$!
init=""
for _ in $(seq 1 100); do
  init=$(pgrep -P "$nspawn_pid" -x systemd || true)
  [ -n "$init" ] && break
  kill -0 "$nspawn_pid" 2>/dev/null || fail "systemd-nspawn exited before booting"
  sleep 0.1
done
[ -n "$init" ] || fail "no systemd in the container after 10 s"
ct() { nsenter -t "$init" -a "$@"; }
state=""
for _ in $(seq 1 300); do
  state=$(ct systemctl is-system-running 2>/dev/null || true)
  case "$state" in running | degraded) break ;; esac
  sleep 0.1
done
case "$state" in running | degraded) ;; *) fail "the container's systemd is '$state' after 30 s" ;; esac
ok "Debian 12 booted with systemd as PID 1 ($state)"

# ---- install and start --------------------------------------------------------------------------
ct dpkg -i /root/sluice.deb >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -i"; }
ok "installed with dpkg -i"
ct systemctl start sluiced || fail "systemctl start sluiced: $(ct systemctl status sluiced --no-pager 2>&1 | tail -n 5)"
# No retry: start returned, so sluiced said READY=1 and answers now.
remaining() {  # per-10-minutes remaining after one more check of api_key=$1
  ct sluicectl check api "api_key=$1" --json | python3 -c '
import json, sys
answer = json.loads(sys.stdin.readline())
print(next(l["remaining"] for l in answer["limits"] if l["name"] == "per-10-minutes"))'
}
r=$(remaining probe) || fail "a check right after systemctl start did not answer"
[ "$r" = 2999 ] || fail "first check of a fresh key: remaining $r, want 2999"
ok "systemctl start returned once sluiced answered checks (Type=notify)"
for _ in 1 2 3 4; do ct sluicectl check api api_key=k9 >/dev/null; done
r=$(remaining k9)
[ "$r" = 2995 ] || fail "after 5 checks: remaining $r, want 2995"

# ---- reload: new rules, the same counts -----------------------------------------------------
ct sh -c 'cp /etc/sluice/rules.yaml /etc/sluice/rules.yaml.orig && cat >>/etc/sluice/rules.yaml' <<'YAML'

  - name: added-by-reload
    rules:
      - name: per-user
        key: [user]
        limits: [5/1m]
YAML
ct sluicectl check added-by-reload user=1 >/dev/null 2>&1 && fail "the new domain answered before the reload"
ct systemctl reload sluiced || fail "systemctl reload sluiced"
known=0
for _ in $(seq 1 50); do
  if ct sluicectl check added-by-reload user=1 >/dev/null 2>&1; then known=1; break; fi
  sleep 0.1
done
[ "$known" = 1 ] || fail "the domain added to rules.yaml is unknown 5 s after systemctl reload"
r=$(remaining k9)
[ "$r" = 2994 ] || fail "after the reload: remaining $r, want 2994 (counts kept)"
ok "systemctl reload applied the new rules and kept the counts"

# ---- kill -9: restarted by systemd, counts restored ----------------------------------------------
ct sluicectl snapshot >/dev/null || fail "sluicectl snapshot"
pid=$(ct systemctl show -p MainPID --value sluiced)
ct kill -9 "$pid"
restarted=0
for _ in $(seq 1 150); do
  new=$(ct systemctl show -p MainPID --value sluiced)
  active=$(ct systemctl is-active sluiced || true)
  if [ "$active" = active ] && [ "$new" != 0 ] && [ "$new" != "$pid" ]; then restarted=1; break; fi
  sleep 0.1
done
[ "$restarted" = 1 ] || fail "sluiced was not restarted within 15 s of kill -9 (Restart=on-failure)"
[ "$(ct systemctl show -p NRestarts --value sluiced)" = 1 ] || fail "NRestarts is not 1"
r=$(remaining k9)
[ "$r" = 2993 ] || fail "after kill -9 and the restart: remaining $r, want 2993 (counts restored)"
ok "kill -9 was followed by a restart with the counts restored"

# ---- hardening at run time ----------------------------------------------------------------------
pid=$(ct systemctl show -p MainPID --value sluiced)
uid=$(ct id -u sluice)
gid=$(ct id -g sluice)
as_sluiced() { ct nsenter -t "$pid" -m -U -S "$uid" -G "$gid" "$@"; }
as_sluiced sh -c 'echo x >/var/lib/sluice/probe && rm /var/lib/sluice/probe' ||
  fail "sluiced cannot write its own state directory"
# In sluiced's view of the file system even root cannot write outside the state directory
# (ProtectSystem=strict, ProtectHome=yes): so the refusals below are the unit's mounts, not
# file permissions.
ct nsenter -t "$pid" -m sh -c 'echo x >/var/lib/sluice/probe && rm /var/lib/sluice/probe' ||
  fail "root in sluiced's mount namespace cannot write the state directory"
for dir in /etc/sluice /usr/bin /var/lib /var/log /root /home; do
  if ct nsenter -t "$pid" -m sh -c "echo x >$dir/sluice-probe" 2>/dev/null; then
    fail "$dir is writable in sluiced's view of the file system"
  fi
  ct sh -c "echo x >$dir/sluice-probe && rm $dir/sluice-probe" 2>/dev/null ||
    [ "$dir" = /home ] || fail "$dir is not writable outside sluiced's namespace either: the check proves nothing"
done
# Its /tmp is its own (PrivateTmp=yes): what it writes there, the system does not see.
as_sluiced sh -c 'echo x >/tmp/sluice-probe' || fail "sluiced cannot write its private /tmp"
! ct test -e /tmp/sluice-probe || fail "sluiced's /tmp is the system's /tmp"
ok "sluiced writes its state directory and its private /tmp, nothing else (/etc/sluice, /usr/bin, /var/lib, /var/log, /root, /home refused)"
exposure=$(ct systemd-analyze security sluiced --no-pager | sed -n 's/.*Overall exposure level for sluiced.service: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "systemd-analyze security printed no exposure level"
python3 -c "import sys; sys.exit(0 if float('$exposure') <= 2.0 else 1)" ||
  fail "systemd-analyze security on the running unit: exposure $exposure, above 2.0"
ok "systemd-analyze security on the running unit: exposure $exposure"

# ---- stop, and the journal ---------------------------------------------------------------------
ct systemctl stop sluiced || fail "systemctl stop sluiced"
[ "$(ct systemctl show -p Result --value sluiced)" = success ] ||
  fail "sluiced's stop did not end in success: $(ct systemctl show -p Result --value sluiced)"
journal=$(ct journalctl -u sluiced --no-pager -o cat)
for line in "sluiced " "rules reloaded from /etc/sluice/rules.yaml" "stopping; answering what is in flight" "sluiced stopped"; do
  grep -qF "$line" <<<"$journal" || fail "the journal of sluiced has no line with '$line'"
done
ok "systemctl stop drained and ended in success; the journal holds the start, reload and stop lines"

# ---- a config it refuses: the start fails, systemd says so, the journal says why ----------------
ct sh -c 'echo "bogus_setting: 1" >>/etc/sluice/sluiced.yaml'
! ct systemctl start sluiced 2>/dev/null || fail "systemctl start succeeded with a config sluiced refuses"
restarts=$(ct systemctl show -p NRestarts --value sluiced)
sleep 5  # two RestartSec= periods: a config error must not be retried
[ "$(ct systemctl show -p NRestarts --value sluiced)" = "$restarts" ] ||
  fail "systemd restarts sluiced after a config error (RestartPreventExitStatus=2 must apply)"
[ "$(ct systemctl is-failed sluiced || true)" = failed ] || fail "the unit is not failed after a refused config"
[ "$(ct systemctl show -p ExecMainStatus --value sluiced)" = 2 ] ||
  fail "exit status $(ct systemctl show -p ExecMainStatus --value sluiced), want 2 (a config error)"
ct journalctl -u sluiced --no-pager -o cat | grep -qF "bogus_setting: unknown setting" ||
  fail "the journal does not say why the config was refused"
ok "a refused config fails the start with exit status 2, is not retried, and the journal says why"
echo "systemd: $checks checks passed"
