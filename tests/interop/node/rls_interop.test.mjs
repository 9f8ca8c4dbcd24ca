// Interop test: sluiced's gRPC front (Envoy's RLS v3 ShouldRateLimit and grpc.health.v1.Health)
// called by @grpc/grpc-js, the gRPC implementation Node services use, with messages built from the
// committed protos by @grpc/proto-loader. A real sluiced runs on free loopback ports with a rules
// file of its own; every call carries a deadline and every wait is bounded.
//
//   SLUICED_BIN=build/daemon/sluiced node --test tests/interop/node/rls_interop.test.mjs
//   (tests/interop/run.sh node does this, after npm ci when needed)
//
// Environment: SLUICED_BIN (required), SLUICE_SOURCE_DIR (default: this file's repository),
// SLUICE_INTEROP_PIDFILE (optional: where to write sluiced's pid, so run.sh can stop it even when
// this process is killed).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http2 from 'node:http2';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { freePorts } from '../../support/free_port.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const sourceDir = process.env.SLUICE_SOURCE_DIR || path.resolve(here, '../../..');
const sluicedBin = process.env.SLUICED_BIN;

let grpc;
let protoLoader;
try {
  grpc = await import('@grpc/grpc-js');
  protoLoader = await import('@grpc/proto-loader');
} catch (e) {
  throw new Error(
    `@grpc/grpc-js or @grpc/proto-loader is not installed in ${here}/node_modules ` +
      `(tests/interop/run.sh node or deploy/setup.sh runs npm ci there): ${e.message}`,
  );
}

const LIMIT = 5;  // per-user: 5 per minute
const TEAM_LIMIT = 100;  // per-team: 100 per hour
const RLS_SERVICE = 'envoy.service.ratelimit.v3.RateLimitService';
const RLS_PATH = `/${RLS_SERVICE}/ShouldRateLimit`;

// 1-second buckets keep a 1-minute window exact over a test that lasts seconds: with the default
// one-minute bucket, checks straddling a minute boundary would see the weighted estimate of the
// previous minute (docs/rules.md, "Estimators") and limit_remaining would not step by one.
const RULES = `domains:
  - name: interop
    rules:
      - name: per-user
        key: [user]
        limits:
          - {limit: ${LIMIT}, window: 1m, name: per-user, granularity: 1s}
      - name: per-team
        key: [team]
        limits:
          - {limit: ${TEAM_LIMIT}, window: 1h, name: per-team}
`;

const loadOptions = {
  keepCase: true,  // field names as in the .proto (limit_remaining, not limitRemaining)
  longs: Number,
  enums: String,
  defaults: true,  // absent scalars read as 0 / '' and absent messages as null
  oneofs: true,
  includeDirs: [path.join(sourceDir, 'lib/rls/proto'), '/usr/include'],
};
const rlsDef = protoLoader.loadSync('envoy/service/ratelimit/v3/rls.proto', loadOptions);
const healthDef = protoLoader.loadSync(path.join(sourceDir, 'tests/interop/health.proto'), loadOptions);
const RateLimitService = grpc.loadPackageDefinition(rlsDef).envoy.service.ratelimit.v3.RateLimitService;
const Health = grpc.loadPackageDefinition(healthDef).grpc.health.v1.Health;
const shouldRateLimitDef = rlsDef[RLS_SERVICE].ShouldRateLimit;

// ---- the daemon -------------------------------------------------------------------------------

const state = {
  dir: null,
  child: null,
  exited: null,  // {code, signal} once sluiced has exited
  grpcPort: 0,
  rls: null,
  health: null,
  failed: false,
};

function sluicedLog() {
  try {
    return fs.readFileSync(path.join(state.dir, 'sluiced.log'), 'utf8');
  } catch {
    return '(no log)';
  }
}

// Stops sluiced: TERM, up to 5 s, then KILL.
async function stopSluiced() {
  const child = state.child;
  if (!child || state.exited) return;
  child.kill('SIGTERM');
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const timer = new Promise((resolve) => setTimeout(resolve, 5000, 'timeout'));
  if ((await Promise.race([exited, timer])) === 'timeout') child.kill('SIGKILL');
}

// Last resort when the test process itself ends or is interrupted.
process.on('exit', () => {
  if (state.child && !state.exited) state.child.kill('SIGKILL');
});
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    if (state.child && !state.exited) state.child.kill('SIGKILL');
    process.exit(1);
  });
}

function unary(client, method, request, deadlineMs = 5000) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + deadlineMs }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });
}

before(async () => {
  assert.ok(
    sluicedBin,
    'SLUICED_BIN is not set: run tests/interop/run.sh node [SLUICED] or set it to build/daemon/sluiced',
  );
  assert.ok(fs.existsSync(sluicedBin), `SLUICED_BIN ${sluicedBin} does not exist (build first)`);
  state.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-rls-node-'));
  fs.writeFileSync(path.join(state.dir, 'rules.yaml'), RULES);
  [state.grpcPort] = await freePorts(1);

  const log = fs.openSync(path.join(state.dir, 'sluiced.log'), 'w');
  const args = [
    '--udp', '', '--tcp', '', '--admin', '', '--resp', '',
    '--grpc', `127.0.0.1:${state.grpcPort}`,
    '--data-dir', '',
    '--rules', path.join(state.dir, 'rules.yaml'),
    '--threads', '1',
    '--log-level', 'warn',
  ];
  state.child = spawn(sluicedBin, args, { stdio: ['ignore', log, log] });
  fs.closeSync(log);
  state.child.once('exit', (code, signal) => {
    state.exited = { code, signal };
  });
  if (process.env.SLUICE_INTEROP_PIDFILE) {
    fs.writeFileSync(process.env.SLUICE_INTEROP_PIDFILE, `${state.child.pid}\n`);
  }

  const address = `127.0.0.1:${state.grpcPort}`;
  state.rls = new RateLimitService(address, grpc.credentials.createInsecure());
  state.health = new Health(address, grpc.credentials.createInsecure());

  // Up to 100 tries, 100 ms apart plus each call's 500 ms deadline: sluiced answers SERVING.
  let last = 'no answer';
  for (let i = 0; i < 100; i++) {
    if (state.exited) {
      throw new Error(`sluiced exited (${JSON.stringify(state.exited)}) before serving:\n${sluicedLog()}`);
    }
    try {
      const r = await unary(state.health, 'Check', { service: '' }, 500);
      if (r.status === 'SERVING') return;
      last = `status ${r.status}`;
    } catch (e) {
      last = e.message;
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`sluiced did not answer Health/Check SERVING (last: ${last}):\n${sluicedLog()}`);
});

after(async () => {
  state.rls?.close();
  state.health?.close();
  const crashed = state.exited;
  await stopSluiced();
  if (state.failed || crashed) {
    console.log(`--- sluiced output${crashed ? ` (it exited: ${JSON.stringify(crashed)})` : ''}`);
    console.log(sluicedLog());
  }
  if (state.dir) fs.rmSync(state.dir, { recursive: true, force: true });
});

// A test case that marks the run failed (so after() prints sluiced's output) and is bounded.
function rlsTest(name, fn) {
  test(name, { timeout: 20000 }, async (t) => {
    try {
      await fn(t);
    } catch (e) {
      state.failed = true;
      throw e;
    }
  });
}

// ---- helpers ----------------------------------------------------------------------------------

const entry = (key, value) => ({ key, value });
const descriptor = (key, value, extra = {}) => ({ entries: [entry(key, value)], ...extra });

function shouldRateLimit(request, deadlineMs) {
  return unary(state.rls, 'ShouldRateLimit', request, deadlineMs);
}

// One descriptor user=<user>; returns its DescriptorStatus after checking the response's shape.
async function checkUser(user, extra = {}) {
  const r = await shouldRateLimit({ domain: 'interop', descriptors: [descriptor('user', user)], ...extra });
  assert.equal(r.statuses.length, 1, 'one status per descriptor');
  assert.equal(r.overall_code, r.statuses[0].code, 'overall_code of a single descriptor');
  return r.statuses[0];
}

function durationSeconds(d) {
  assert.ok(d, 'duration_until_reset is set');
  return Number(d.seconds) + d.nanos / 1e9;
}

// current_limit is the per-user limit; duration_until_reset is at most its minute plus one 1-second
// bucket (a hit leaves the sliding window when its whole bucket has), and above 0 once the key has
// counted hits (with none, nothing is left to reset).
function assertPerUserLimit(status, { hasHits = true } = {}) {
  assert.deepEqual(status.current_limit, { name: 'per-user', requests_per_unit: LIMIT, unit: 'MINUTE' });
  const reset = durationSeconds(status.duration_until_reset);
  assert.ok(reset >= 0 && reset <= 61, `duration_until_reset ${reset}s is within the 1-minute window`);
  if (hasHits) assert.ok(reset > 0, 'duration_until_reset is above 0 once hits are counted');
}

// Sends one raw gRPC request over HTTP/2 (node:http2, not grpc-js) with the given grpc-timeout
// header, so the server, not this client, has to act on the deadline. Returns the grpc-status and
// the decoded response, if any.
function rawShouldRateLimit(request, grpcTimeout) {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://127.0.0.1:${state.grpcPort}`);
    const timer = setTimeout(() => {
      session.destroy();
      reject(new Error('raw HTTP/2 call: no answer within 5 s'));
    }, 5000);
    session.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    const message = shouldRateLimitDef.requestSerialize(request);
    const frame = Buffer.alloc(5 + message.length);
    frame.writeUInt8(0, 0);  // not compressed
    frame.writeUInt32BE(message.length, 1);
    message.copy(frame, 5);
    const req = session.request({
      ':method': 'POST',
      ':path': RLS_PATH,
      'content-type': 'application/grpc',
      te: 'trailers',
      'grpc-timeout': grpcTimeout,
    });
    let headers = {};
    let trailers = {};
    const chunks = [];
    req.on('response', (h) => (headers = h));
    req.on('trailers', (t) => (trailers = t));
    req.on('data', (c) => chunks.push(c));
    req.on('error', (e) => {
      clearTimeout(timer);
      session.close();
      reject(e);
    });
    req.on('end', () => {
      clearTimeout(timer);
      session.close();
      // A trailers-only answer carries grpc-status in its headers.
      const grpcStatus = trailers['grpc-status'] ?? headers['grpc-status'];
      const body = Buffer.concat(chunks);
      let response = null;
      if (body.length >= 5) response = shouldRateLimitDef.responseDeserialize(body.subarray(5, 5 + body.readUInt32BE(1)));
      resolve({ grpcStatus: grpcStatus === undefined ? undefined : Number(grpcStatus), response });
    });
    req.end(frame);
  });
}

// Waits until every thread of `pid` is stopped (state T in /proc): a signal is delivered
// asynchronously, and a loopback call is fast enough to be answered in between. Bounded: 2 s.
async function waitStopped(pid) {
  const taskDir = `/proc/${pid}/task`;
  for (let i = 0; i < 200; i++) {
    const states = [];
    for (const tid of fs.readdirSync(taskDir)) {
      try {
        const stat = fs.readFileSync(`${taskDir}/${tid}/stat`, 'utf8');
        states.push(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0]);
      } catch {
        // the thread has gone
      }
    }
    if (states.length > 0 && states.every((st) => st === 'T' || st === 't')) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`sluiced (pid ${pid}) did not stop within 2 s of SIGSTOP`);
}

// ---- the cases --------------------------------------------------------------------------------

rlsTest('health: Check of the server ("") answers SERVING', async () => {
  const r = await unary(state.health, 'Check', { service: '' });
  assert.equal(r.status, 'SERVING');
});

rlsTest('health: the RLS service is SERVING, an unknown service NOT_FOUND', async () => {
  const r = await unary(state.health, 'Check', { service: RLS_SERVICE });
  assert.equal(r.status, 'SERVING');
  await assert.rejects(unary(state.health, 'Check', { service: 'no.such.Service' }), (e) => {
    assert.equal(e.code, grpc.status.NOT_FOUND, `status ${e.code} (${e.details})`);
    return true;
  });
});

rlsTest('five checks of user=alice are OK with limit_remaining 4,3,2,1,0, the sixth OVER_LIMIT', async () => {
  for (let i = 1; i <= LIMIT; i++) {
    const s = await checkUser('alice');
    assert.equal(s.code, 'OK', `check ${i}`);
    assert.equal(s.limit_remaining, LIMIT - i, `check ${i}: limit_remaining`);
    assertPerUserLimit(s);
  }
  const s = await checkUser('alice');
  assert.equal(s.code, 'OVER_LIMIT', 'check 6');
  assert.equal(s.limit_remaining, 0, 'check 6: limit_remaining');
  assertPerUserLimit(s);
});

rlsTest('current_limit names the limit, its requests_per_unit and unit (MINUTE, HOUR)', async () => {
  const r = await shouldRateLimit({
    domain: 'interop',
    descriptors: [descriptor('user', 'limit-fields'), descriptor('team', 'limit-fields')],
  });
  assert.equal(r.overall_code, 'OK');
  assert.equal(r.statuses.length, 2);
  assert.equal(r.statuses[0].code, 'OK');
  assert.equal(r.statuses[0].limit_remaining, LIMIT - 1);
  assertPerUserLimit(r.statuses[0]);
  assert.equal(r.statuses[1].code, 'OK');
  assert.equal(r.statuses[1].limit_remaining, TEAM_LIMIT - 1);
  assert.deepEqual(r.statuses[1].current_limit, { name: 'per-team', requests_per_unit: TEAM_LIMIT, unit: 'HOUR' });
  const reset = durationSeconds(r.statuses[1].duration_until_reset);
  // At most the hour plus its one-minute bucket.
  assert.ok(reset > 0 && reset <= 3660, `per-team duration_until_reset ${reset}s is within the hour`);
});

rlsTest('two descriptors: statuses in request order, overall OVER_LIMIT when one is over', async () => {
  // Use up user=bob's minute with one request of hits_addend 5.
  const used = await checkUser('bob', { hits_addend: LIMIT });
  assert.equal(used.code, 'OK');
  assert.equal(used.limit_remaining, 0);

  const r = await shouldRateLimit({
    domain: 'interop',
    descriptors: [descriptor('team', 'two-descriptors'), descriptor('user', 'bob')],
  });
  assert.equal(r.overall_code, 'OVER_LIMIT');
  assert.equal(r.statuses.length, 2);
  assert.equal(r.statuses[0].code, 'OK', 'team (first descriptor)');
  assert.equal(r.statuses[0].current_limit?.name, 'per-team');
  assert.equal(r.statuses[0].limit_remaining, TEAM_LIMIT - 1);
  assert.equal(r.statuses[1].code, 'OVER_LIMIT', 'user=bob (second descriptor)');
  assert.equal(r.statuses[1].current_limit?.name, 'per-user');
  assert.equal(r.statuses[1].limit_remaining, 0);

  // The same two, the other way round: the order of statuses follows the request.
  const swapped = await shouldRateLimit({
    domain: 'interop',
    descriptors: [descriptor('user', 'bob'), descriptor('team', 'two-descriptors')],
  });
  assert.equal(swapped.overall_code, 'OVER_LIMIT');
  assert.deepEqual(swapped.statuses.map((s) => [s.code, s.current_limit?.name]), [
    ['OVER_LIMIT', 'per-user'],
    ['OK', 'per-team'],
  ]);
});

rlsTest("the request's hits_addend is what each check counts", async () => {
  let s = await checkUser('carol', { hits_addend: 3 });
  assert.equal(s.code, 'OK');
  assert.equal(s.limit_remaining, 2);
  s = await checkUser('carol', { hits_addend: 2 });
  assert.equal(s.code, 'OK');
  assert.equal(s.limit_remaining, 0);
  s = await checkUser('carol', { hits_addend: 1 });
  assert.equal(s.code, 'OVER_LIMIT');

  // More than the whole limit at once is over it, on a fresh key.
  s = await checkUser('carol-big', { hits_addend: LIMIT + 1 });
  assert.equal(s.code, 'OVER_LIMIT');
  assertPerUserLimit(s, { hasHits: false });
  // ... and, denied, was not counted (count_denied is off): one hit still fits.
  s = await checkUser('carol-big');
  assert.equal(s.code, 'OK');
  assert.equal(s.limit_remaining, LIMIT - 1);
});

rlsTest("a descriptor's hits_addend 0 checks without counting, and wins over the request's", async () => {
  for (let i = 0; i < 3; i++) {
    const s = await checkUser('dave', { descriptors: [descriptor('user', 'dave', { hits_addend: { value: 0 } })] });
    assert.equal(s.code, 'OK', `look ${i + 1}`);
    assert.equal(s.limit_remaining, LIMIT, `look ${i + 1}: nothing counted`);
    assertPerUserLimit(s, { hasHits: false });
  }
  // Request hits_addend 3: the first descriptor says 0 for itself, the second takes the 3.
  const r = await shouldRateLimit({
    domain: 'interop',
    hits_addend: 3,
    descriptors: [descriptor('user', 'dave', { hits_addend: { value: 0 } }), descriptor('user', 'erin')],
  });
  assert.equal(r.overall_code, 'OK');
  assert.deepEqual(r.statuses.map((s) => [s.code, s.limit_remaining]), [
    ['OK', LIMIT],
    ['OK', LIMIT - 3],
  ]);
  // A descriptor's own hits_addend 2 wins over the request's 1 (the default).
  const s = await checkUser('dave', { descriptors: [descriptor('user', 'dave', { hits_addend: { value: 2 } })] });
  assert.equal(s.limit_remaining, LIMIT - 2);
});

rlsTest('unknown domain: OK, with no current_limit', async () => {
  const r = await shouldRateLimit({ domain: 'no-such-domain', descriptors: [descriptor('user', 'alice')] });
  assert.equal(r.overall_code, 'OK');
  assert.equal(r.statuses.length, 1);
  assert.equal(r.statuses[0].code, 'OK');
  assert.equal(r.statuses[0].current_limit, null);
});

rlsTest('empty domain: gRPC status INVALID_ARGUMENT', async () => {
  await assert.rejects(
    shouldRateLimit({ domain: '', descriptors: [descriptor('user', 'alice')] }),
    (e) => {
      assert.equal(e.code, grpc.status.INVALID_ARGUMENT, `status ${e.code} (${e.details})`);
      return true;
    },
  );
});

rlsTest('deadline honoured: answered within a short deadline; a stalled server is DEADLINE_EXCEEDED', async () => {
  // grpc-js sends the deadline as grpc-timeout; the answer comes well within it.
  const started = Date.now();
  const r = await shouldRateLimit({ domain: 'interop', descriptors: [descriptor('user', 'frank')] }, 1000);
  assert.equal(r.overall_code, 'OK');
  assert.ok(Date.now() - started < 1000, 'answered within the 1 s deadline');

  // grpc-timeout in each of its units is understood by the server (sent raw, not by grpc-js).
  for (const timeout of ['2S', '2000m', '2000000u', '2000000000n', '1M']) {
    const raw = await rawShouldRateLimit({ domain: 'interop', descriptors: [descriptor('user', `grace-${timeout}`)] }, timeout);
    assert.equal(raw.grpcStatus, grpc.status.OK, `grpc-timeout ${timeout}`);
    assert.equal(raw.response?.overall_code, 'OK', `grpc-timeout ${timeout}`);
    assert.equal(raw.response?.statuses[0]?.limit_remaining, LIMIT - 1, `grpc-timeout ${timeout}`);
  }

  // sluiced stopped (SIGSTOP) while a call with a 300 ms deadline is out: the call ends with
  // DEADLINE_EXCEEDED near its deadline instead of waiting, and once sluiced runs again it answers
  // the next call as usual.
  let err = null;
  let stalled = 0;
  state.child.kill('SIGSTOP');
  try {
    await waitStopped(state.child.pid);
    stalled = Date.now();
    await shouldRateLimit({ domain: 'interop', descriptors: [descriptor('user', 'ivan')] }, 300);
  } catch (e) {
    err = e;
  } finally {
    state.child.kill('SIGCONT');
  }
  const waited = Date.now() - stalled;
  assert.equal(err?.code, grpc.status.DEADLINE_EXCEEDED, `status ${err?.code} (${err?.details})`);
  assert.ok(waited >= 250 && waited < 2300, `ended after ${waited} ms, deadline 300 ms`);
  const after = await checkUser('judy');
  assert.equal(after.code, 'OK');
  assert.equal(after.limit_remaining, LIMIT - 1);
});
