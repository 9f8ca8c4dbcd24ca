# Sourced (bash) by the scripts that run a test which starts its own sluiced: tests/interop/run.sh,
# tests/ui/run.sh. Whatever ends the script (the test's end, a failure, INT or TERM from CTest's
# timeout) stops that sluiced and the test, and removes their temporary files.
#
#   guard_start NAME PIDVAR   makes a temporary directory, exported as TMPDIR (the test's own files
#                             go there too), and exports PIDVAR=<dir>/sluiced.pid: the test writes
#                             sluiced's pid to it (one per line when it starts several), and the
#                             exit trap stops those processes (TERM, up to 5 s, then KILL)
#   guard_run CMD [ARGS...]   runs CMD in the background and waits for it: bash runs traps only
#                             between commands, so a signal to the script is handled at once, not
#                             after a foreground test ends. CMD is exec'd: its pid is the test's.

guard_tmp=""
guard_pidfile=""
guard_test_pid=""

guard_cleanup() {
  local status=$? pid
  if [ -n "$guard_test_pid" ]; then kill -TERM "$guard_test_pid" 2>/dev/null || true; fi
  for pid in $(cat "$guard_pidfile" 2>/dev/null || true); do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if [ -n "$guard_tmp" ]; then rm -rf "$guard_tmp"; fi
  exit "$status"
}

guard_start() {
  guard_tmp=$(mktemp -d "${TMPDIR:-/tmp}/sluice-$1.XXXXXX")
  guard_pidfile=$guard_tmp/sluiced.pid
  export "$2=$guard_pidfile" TMPDIR=$guard_tmp
  trap guard_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

guard_run() {
  (exec "$@") &
  guard_test_pid=$!
  wait "$guard_test_pid"
}
