#!/usr/bin/env bash
# The Debian package end to end (ctest label `package`): builds sluice_<version>_amd64.deb with
# cpack from a build tree, installs it on this machine with dpkg, checks the files, the user, the
# data directory and a first start as that user, then `dpkg -r` (binaries gone, config and data
# kept) and `dpkg -P` (everything gone).
#
#   tests/package/deb_test.sh BUILD_DIR
#
# Needs root (CI runs as root) and a machine without Sluice installed, a `sluice` user or
# /etc/sluice, /var/lib/sluice: otherwise it fails with the reason and touches nothing. Whatever
# happens, the machine is left as it was found (trap on exit).
set -euo pipefail

build=${1:?usage: deb_test.sh BUILD_DIR}
checks=0
fail() { echo "FAILED: $*" >&2; exit 1; }
ok() { checks=$((checks + 1)); echo "ok: $*"; }
pkg_state() { dpkg-query -W -f='${db:Status-Status}' sluice 2>/dev/null || echo not-installed; }

[ "$(id -u)" -eq 0 ] || fail "needs root: it installs the package with dpkg -i (run it as root, as CI does)"
for tool in cpack dpkg dpkg-deb dpkg-shlibdeps adduser setpriv; do
  command -v "$tool" >/dev/null || fail "$tool not found (deploy/setup.sh installs what is needed)"
done
[ -f "$build/CPackConfig.cmake" ] || fail "$build/CPackConfig.cmake missing: configure the build first"
[ "$(pkg_state)" = not-installed ] || fail "the package sluice is on this machine already ($(pkg_state)): not touching it"
! getent passwd sluice >/dev/null || fail "a user 'sluice' exists already: not touching it"
! getent group sluice >/dev/null || fail "a group 'sluice' exists already: not touching it"
for p in /etc/sluice /var/lib/sluice /usr/bin/sluiced /usr/bin/sluicectl; do
  [ ! -e "$p" ] || fail "$p exists already: not touching it"
done

work=$(mktemp -d)
daemon_pid=""
cleanup() {
  local rc=$?
  if [ -n "$daemon_pid" ]; then kill -9 "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  if [ "$(pkg_state)" != not-installed ]; then dpkg -P sluice >/dev/null 2>&1 || true; fi
  if getent passwd sluice >/dev/null; then userdel sluice 2>/dev/null || true; fi
  if getent group sluice >/dev/null; then groupdel sluice 2>/dev/null || true; fi
  rm -rf /etc/sluice /var/lib/sluice "$work"
  exit "$rc"
}
trap cleanup EXIT

# ---- build -----------------------------------------------------------------------------------
if ! cpack --config "$build/CPackConfig.cmake" -B "$work" >"$work/cpack.log" 2>&1; then
  cat "$work/cpack.log" >&2
  fail "cpack did not build the package"
fi
debs=("$work"/sluice_*_amd64.deb)
[ "${#debs[@]}" -eq 1 ] && [ -f "${debs[0]}" ] || fail "no single sluice_<version>_amd64.deb in $work: $(ls "$work")"
deb=${debs[0]}
ok "built $(basename "$deb") ($(du -h "$deb" | cut -f1))"
depends=$(dpkg-deb -f "$deb" Depends)
for d in adduser libc6 libstdc++6 libyaml-cpp; do
  grep -q "$d" <<<"$depends" || fail "Depends lacks $d: $depends"
done
ok "Depends: $depends"

# ---- install ---------------------------------------------------------------------------------
dpkg -i "$deb" >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; fail "dpkg -i"; }
[ "$(pkg_state)" = installed ] || fail "after dpkg -i the package is $(pkg_state)"
for f in /usr/bin/sluiced /usr/bin/sluicectl; do [ -x "$f" ] || fail "$f missing or not executable"; done
for f in /etc/sluice/sluiced.yaml /etc/sluice/rules.yaml /lib/systemd/system/sluiced.service \
         /usr/share/doc/sluice/README.md /usr/share/doc/sluice/operations.md; do
  [ -f "$f" ] || fail "$f missing"
done
ok "files in /usr/bin, /etc/sluice, /lib/systemd/system, /usr/share/doc/sluice"
grep -qx 'ExecStart=/usr/bin/sluiced --config /etc/sluice/sluiced.yaml' /lib/systemd/system/sluiced.service ||
  fail "the unit's ExecStart: $(grep ExecStart= /lib/systemd/system/sluiced.service)"
grep -q '^rules: /etc/sluice/rules.yaml' /etc/sluice/sluiced.yaml || fail "sluiced.yaml: no rules: /etc/sluice/rules.yaml"
grep -q '^data_dir: /var/lib/sluice' /etc/sluice/sluiced.yaml || fail "sluiced.yaml: no data_dir: /var/lib/sluice"
ok "unit and config name the installed paths"
conffiles=$(dpkg-query -W -f='${Conffiles}' sluice)
for f in /etc/sluice/sluiced.yaml /etc/sluice/rules.yaml; do
  grep -q " $f " <<<"$conffiles" || fail "$f is not a conffile: $conffiles"
done
ok "conffiles: /etc/sluice/sluiced.yaml, /etc/sluice/rules.yaml"

IFS=: read -r _ _ uid gid _ home shell < <(getent passwd sluice) || fail "no user sluice after dpkg -i"
[ "$uid" -lt 1000 ] || fail "user sluice has uid $uid: not a system user"
[ "$(getent group sluice | cut -d: -f3)" = "$gid" ] || fail "user sluice's primary group is not sluice"
[ "$shell" = /usr/sbin/nologin ] || fail "user sluice has the shell $shell"
[ ! -e "$home" ] || [ "$home" = /nonexistent ] || fail "user sluice has a home: $home"
ok "system user sluice (uid $uid, group sluice, $shell)"
[ "$(stat -c '%U:%G %a' /var/lib/sluice)" = "sluice:sluice 700" ] ||
  fail "/var/lib/sluice is $(stat -c '%U:%G %a' /var/lib/sluice), not sluice:sluice 700"
ok "/var/lib/sluice sluice:sluice 700"

out=$(/usr/bin/sluiced --check --config /etc/sluice/sluiced.yaml 2>&1) || fail "sluiced --check: $out"
grep -q "valid" <<<"$out" || fail "sluiced --check said: $out"
ok "sluiced --check --config /etc/sluice/sluiced.yaml: $(tail -n 1 <<<"$out")"

# A first start as the service's user, on a free UDP port only: it must create its database in
# /var/lib/sluice and stop cleanly on SIGTERM.
# setpriv execs sluiced itself (runuser would stay in between and take the SIGTERM).
setpriv --reuid=sluice --regid=sluice --clear-groups /usr/bin/sluiced --config /etc/sluice/sluiced.yaml \
  --udp 127.0.0.1:0 --tcp "" --admin "" --grpc "" --resp "" >"$work/sluiced.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  grep -q "sluiced serving" "$work/sluiced.log" && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/sluiced.log" >&2; fail "sluiced exited at its first start"; }
  sleep 0.1
done
grep -q "sluiced serving" "$work/sluiced.log" || { cat "$work/sluiced.log" >&2; fail "sluiced not serving within 10 s"; }
kill -TERM "$daemon_pid"
for _ in $(seq 200); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$daemon_pid" 2>/dev/null && fail "sluiced still running 20 s after SIGTERM"
status=0; wait "$daemon_pid" || status=$?
daemon_pid=""
[ "$status" -eq 0 ] || { cat "$work/sluiced.log" >&2; fail "sluiced exited $status after SIGTERM"; }
[ "$(stat -c %U /var/lib/sluice/CURRENT 2>/dev/null)" = sluice ] || fail "no database of user sluice in /var/lib/sluice"
ok "first start as user sluice: database in /var/lib/sluice, exit 0 on SIGTERM"

# Installing again (as an upgrade to the same version does) keeps the user and the data.
dpkg -i "$deb" >"$work/install2.log" 2>&1 || { cat "$work/install2.log" >&2; fail "second dpkg -i"; }
[ "$(getent passwd sluice | cut -d: -f3)" = "$uid" ] || fail "a second dpkg -i changed user sluice"
[ -f /var/lib/sluice/CURRENT ] || fail "a second dpkg -i lost /var/lib/sluice"
ok "second dpkg -i: same user, data kept"

# ---- remove: binaries go, config, data and user stay -------------------------------------------
echo "# a local change" >>/etc/sluice/rules.yaml
dpkg -r sluice >"$work/remove.log" 2>&1 || { cat "$work/remove.log" >&2; fail "dpkg -r"; }
[ "$(pkg_state)" = config-files ] || fail "after dpkg -r the package is $(pkg_state), not config-files"
for f in /usr/bin/sluiced /usr/bin/sluicectl /lib/systemd/system/sluiced.service /usr/share/doc/sluice; do
  [ ! -e "$f" ] || fail "$f still there after dpkg -r"
done
grep -q "# a local change" /etc/sluice/rules.yaml || fail "dpkg -r lost the changed /etc/sluice/rules.yaml"
[ -f /etc/sluice/sluiced.yaml ] || fail "dpkg -r removed /etc/sluice/sluiced.yaml"
[ -f /var/lib/sluice/CURRENT ] || fail "dpkg -r removed the data in /var/lib/sluice"
getent passwd sluice >/dev/null || fail "dpkg -r removed the user sluice"
ok "dpkg -r: binaries, unit and docs gone; conffiles, data and user kept"

# ---- purge: everything goes ------------------------------------------------------------------
dpkg -P sluice >"$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; fail "dpkg -P"; }
[ "$(pkg_state)" = not-installed ] || fail "after dpkg -P the package is $(pkg_state)"
for p in /etc/sluice /var/lib/sluice; do [ ! -e "$p" ] || fail "$p still there after dpkg -P"; done
! getent passwd sluice >/dev/null || fail "user sluice still there after dpkg -P"
! getent group sluice >/dev/null || fail "group sluice still there after dpkg -P"
ok "dpkg -P: config, data, user and group gone"

echo "deb_test: $checks passed, 0 failed"
