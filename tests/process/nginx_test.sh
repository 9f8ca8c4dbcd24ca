#!/usr/bin/env bash
# Process test: nginx with deploy/nginx/sluice-auth.conf in front of a static application, sluiced
# behind its auth_request. A client sends LIMIT+1 requests: LIMIT get the application's 200 with
# RateLimit headers, the last gets nginx's 429 with RateLimit headers and Retry-After.
#
#   tests/process/nginx_test.sh SLUICED_BINARY EXAMPLE_CONF
#
# Everything runs as the current user on free loopback ports, under a temporary directory that is
# removed at exit. Every wait is bounded. Exit 77 (skipped) when nginx or curl is missing.
set -euo pipefail

sluiced=${1:?usage: nginx_test.sh SLUICED_BINARY EXAMPLE_CONF}
example=${2:?usage: nginx_test.sh SLUICED_BINARY EXAMPLE_CONF}
LIMIT=5

nginx_bin=$(command -v nginx || true)
[ -x "$nginx_bin" ] || nginx_bin=/usr/sbin/nginx
if [ ! -x "$nginx_bin" ] || ! command -v curl >/dev/null; then
  echo "SKIP: nginx or curl not installed (deploy/setup.sh installs both)"
  exit 77
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/sluice-nginx-test.XXXXXX")
nginx_pid=""
sluiced_pid=""

# Stops a process we started: TERM, up to 5 s, then KILL.
stop_pid() {
  local pid=$1
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local status=$?
  stop_pid "$nginx_pid"
  stop_pid "$sluiced_pid"
  if [ "$status" -ne 0 ]; then
    echo "--- nginx error.log"; cat "$dir/error.log" 2>/dev/null || true
    echo "--- sluiced output"; cat "$dir/sluiced.log" 2>/dev/null || true
  fi
  rm -rf "$dir"
  exit "$status"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  exit 1
}

# Free loopback ports, all different, below the ephemeral range.
read -r nginx_port app_port admin_port < <(python3 "$(dirname "${BASH_SOURCE[0]}")/../support/free_port.py" 3)

# Waits until URL answers with any HTTP status (bounded: 10 s).
wait_http() {
  for _ in $(seq 100); do
    if curl -s -o /dev/null --max-time 1 "$1"; then return 0; fi
    sleep 0.1
  done
  return 1
}

# ---- sluiced ----------------------------------------------------------------------------------
cat >"$dir/rules.yaml" <<EOF
domains:
  - name: api
    rules:
      - name: per-ip
        key: [ip]
        limits:
          - {limit: $LIMIT, window: 1h, name: per-ip}
      - name: per-key
        key: [api_key]
        limits:
          - {limit: 1000, window: 1h, name: per-key}
EOF
cat >"$dir/sluiced.yaml" <<EOF
udp: null
tcp: null
admin: 127.0.0.1:$admin_port
grpc: null
resp: null
rules: $dir/rules.yaml
threads: 1
data_dir: $dir/data
init_data: true
log_level: warn
EOF
"$sluiced" --config "$dir/sluiced.yaml" >"$dir/sluiced.log" 2>&1 &
sluiced_pid=$!
wait_http "http://127.0.0.1:$admin_port/healthz" || fail "sluiced did not answer /healthz within 10 s"

# ---- nginx ------------------------------------------------------------------------------------
# The example, with its ports moved to the free ones.
sed -e "s/listen 8080;/listen 127.0.0.1:$nginx_port;/" \
    -e "s/127\.0\.0\.1:7351/127.0.0.1:$admin_port/" \
    -e "s/127\.0\.0\.1:8081/127.0.0.1:$app_port/" \
    "$example" >"$dir/sluice-auth.conf"
grep -q "listen 127.0.0.1:$nginx_port;" "$dir/sluice-auth.conf" || fail "example: listen 8080 not found"
grep -q "127.0.0.1:$admin_port" "$dir/sluice-auth.conf" || fail "example: 127.0.0.1:7351 not found"
grep -q "127.0.0.1:$app_port" "$dir/sluice-auth.conf" || fail "example: 127.0.0.1:8081 not found"

user_line=""
if [ "$(id -u)" -eq 0 ]; then user_line="user root;"; fi  # workers stay the current user
cat >"$dir/nginx.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
error_log $dir/error.log warn;
events { worker_connections 64; }
http {
    access_log $dir/access.log;
    client_body_temp_path $dir/client_body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;

    # The application: a static answer, reached only through the auth check.
    server {
        listen 127.0.0.1:$app_port;
        location / {
            default_type text/plain;
            return 200 "hello from the app (shadow=\$http_sluice_shadow)\n";
        }
    }

    include $dir/sluice-auth.conf;
}
EOF
nginx_args=(-p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -g "pid $dir/nginx.pid;")
"$nginx_bin" -t -q "${nginx_args[@]}" || fail "nginx -t rejected the config"
"$nginx_bin" "${nginx_args[@]}" &
nginx_pid=$!
wait_http "http://127.0.0.1:$nginx_port/" || fail "nginx did not answer within 10 s"

# ---- the client -------------------------------------------------------------------------------
# request N [extra curl args...]: GET /api/hello; status into $code, headers into $dir/h.N,
# body into $dir/b.N.
request() {
  local n=$1
  shift
  code=$(curl -s --max-time 5 -o "$dir/b.$n" -D "$dir/h.$n" -w '%{http_code}' \
    -H 'X-Api-Key: key-1' "$@" "http://127.0.0.1:$nginx_port/api/hello")
}
header() {  # header N NAME: the value of NAME in response N (case-insensitive), CR stripped
  grep -i "^$2:" "$dir/h.$1" | head -1 | cut -d: -f2- | sed -e 's/^ *//' -e 's/\r$//'
}

for i in $(seq "$LIMIT"); do
  request "$i"
  [ "$code" = 200 ] || fail "request $i: status $code, expected 200 ($(cat "$dir/b.$i"))"
  grep -q "hello from the app" "$dir/b.$i" || fail "request $i: body is not the application's"
  want="\"per-ip\";r=$((LIMIT - i));t=3"
  got=$(header "$i" RateLimit)
  [[ "$got" == "$want"* ]] || fail "request $i: RateLimit '$got', expected '$want...'"
  got=$(header "$i" RateLimit-Policy)
  [ "$got" = "\"per-ip\";q=$LIMIT;w=3600, \"per-key\";q=1000;w=3600" ] ||
    fail "request $i: RateLimit-Policy '$got'"
  [ "$(header "$i" RateLimit-Remaining)" = "$((LIMIT - i))" ] || fail "request $i: RateLimit-Remaining"
  [ -z "$(header "$i" Retry-After)" ] || fail "request $i: Retry-After on an allowed request"
done

# One more: over the per-ip limit. The client also tries to smuggle a descriptor of its own, which
# must not reach Sluice (it would make the check a 400 / nginx 500, not a 429).
n=$((LIMIT + 1))
request "$n" -H 'X-Sluice-Ip: 192.0.2.1'
[ "$code" = 429 ] || fail "request $n: status $code, expected 429 ($(cat "$dir/b.$n"))"
grep -q '"rate limited"' "$dir/b.$n" || fail "request $n: body '$(cat "$dir/b.$n")'"
[ "$(header "$n" Content-Type)" = application/json ] || fail "request $n: Content-Type"
retry=$(header "$n" Retry-After)
[[ "$retry" =~ ^[0-9]+$ ]] && [ "$retry" -gt 0 ] && [ "$retry" -le 3660 ] ||
  fail "request $n: Retry-After '$retry'"
[ "$(header "$n" RateLimit)" = "\"per-ip\";r=0;t=$retry" ] ||
  fail "request $n: RateLimit '$(header "$n" RateLimit)' (Retry-After $retry)"
[ "$(header "$n" RateLimit-Remaining)" = 0 ] || fail "request $n: RateLimit-Remaining"
[ "$(header "$n" RateLimit-Reset)" = "$retry" ] || fail "request $n: RateLimit-Reset"
[ -n "$(header "$n" RateLimit-Policy)" ] || fail "request $n: no RateLimit-Policy"

# Sluice saw LIMIT+1 checks, LIMIT allowed by per-ip and one denied.
metrics=$(curl -s --max-time 5 "http://127.0.0.1:$admin_port/metrics")
grep -q "^sluice_rule_decisions_total{domain=\"api\",rule=\"per-ip\",decision=\"allowed\"} $LIMIT\$" \
  <<<"$metrics" || fail "metrics: per-ip allowed is not $LIMIT"
grep -q "^sluice_rule_decisions_total{domain=\"api\",rule=\"per-ip\",decision=\"denied\"} 1\$" \
  <<<"$metrics" || fail "metrics: per-ip denied is not 1"

echo "PASS: $LIMIT requests allowed through nginx, request $n answered 429 (Retry-After $retry)"
