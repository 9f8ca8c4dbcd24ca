// The RESP door of a real sluiced called by Node's stock Redis clients, each with its default
// settings: ioredis 5 (RESP2, an INFO ready check), ioredis 6 (HELLO 3), node-redis 4 (RESP2) and
// node-redis 6 (HELLO 3). For each: CL.THROTTLE single and pipelined, MULTI/EXEC, DEL, AUTH, and
// SLUICE.CHECK against the rules. tests/interop/resp/run.sh starts sluiced and sets
// SLUICE_RESP_PORT, SLUICE_RESP_AUTH_PORT and SLUICE_RESP_PASSWORD; every case is bounded.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const port = Number(process.env.SLUICE_RESP_PORT);
const authPort = Number(process.env.SLUICE_RESP_AUTH_PORT);
const password = process.env.SLUICE_RESP_PASSWORD;
assert.ok(port && authPort && password, 'run by tests/interop/resp/run.sh node (it sets SLUICE_RESP_*)');

async function load(name) {
  try {
    return await import(name);
  } catch (e) {
    throw new Error(
      `${name} is not installed in ${here}/node_modules (tests/interop/resp/run.sh node or ` +
        `deploy/setup.sh runs npm ci there): ${e.message}`,
    );
  }
}

// redis-cell's README example: a fresh key, burst 15, 30 per 60 s.
const FRESH = [0, 16, 15, -1, 2];
const throttleArgs = (key) => ['CL.THROTTLE', key, '15', '30', '60'];

// One adapter per client family: connect with defaults, send a raw command, pipeline, MULTI/EXEC.
function ioredisAdapter(Redis) {
  return {
    async connect(p, options = {}) {
      // Defaults, except: no reconnects or retries and a bounded connect, so a failure ends the
      // test.
      const c = new Redis({ host: '127.0.0.1', port: p, retryStrategy: () => null, connectTimeout: 5000,
        maxRetriesPerRequest: 0, ...options });
      // A connection error ends the connection (no retries): connect() rejects with it.
      let lastError = null;
      c.on('error', (e) => {
        lastError = e;
      });
      await new Promise((resolve, reject) => {
        c.once('ready', resolve);
        c.once('end', () => reject(lastError ?? new Error('connection ended before ready')));
      });
      return c;
    },
    call: (c, args) => c.call(...args),
    async pipeline(c, commands) {
      const results = await c.pipeline(commands.map((a) => ['call', ...a])).exec();
      for (const [err] of results) if (err) throw err;
      return results.map(([, v]) => v);
    },
    async multi(c, commands) {
      const results = await c.multi(commands.map((a) => ['call', ...a])).exec();
      for (const [err] of results) if (err) throw err;
      return results.map(([, v]) => v);
    },
    close: (c) => c.disconnect(),
  };
}

function nodeRedisAdapter(createClient) {
  return {
    async connect(p, options = {}) {
      const c = createClient({
        socket: { host: '127.0.0.1', port: p, connectTimeout: 5000, reconnectStrategy: false },
        ...options,
      });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    call: (c, args) => c.sendCommand(args),
    async pipeline(c, commands) {
      // node-redis pipelines commands sent in the same tick.
      return Promise.all(commands.map((a) => c.sendCommand(a)));
    },
    async multi(c, commands) {
      const m = c.multi();
      for (const a of commands) m.addCommand(a);
      return m.exec();
    },
    close: (c) => c.disconnect(),
  };
}

const ioredis5 = (await load('ioredis5')).default;
const ioredis6 = (await load('ioredis6')).default;
const redis4 = await load('redis4');
const redis6 = await load('redis6');
// resp3: whether the client's defaults say HELLO 3.
const clients = {
  'ioredis 5': { ...ioredisAdapter(ioredis5), resp3: false },
  'ioredis 6': { ...ioredisAdapter(ioredis6), resp3: true },
  'node-redis 4': { ...nodeRedisAdapter(redis4.createClient), resp3: false },
  'node-redis 6': { ...nodeRedisAdapter(redis6.createClient), resp3: true },
};

// RESP3 replies an array of integers the same as RESP2; node-redis may hand integers back as
// numbers either way.
const ints = (reply) => reply.map(Number);

// SLUICE.CHECK's fields in order: a RESP2 array, or after HELLO 3 a map whose keys name them
// (node-redis 6 gives a plain object; ioredis 6's call() flattens a map to [key, value, ...]).
const CHECK_FIELDS = ['allowed', 'limit', 'remaining', 'retry_after_s', 'reset_s', 'shadow',
  'would_deny'];
function checkFields(reply, resp3) {
  if (!resp3) {
    assert.ok(Array.isArray(reply), `a RESP2 array, got ${JSON.stringify(reply)}`);
    return ints(reply);
  }
  let m = reply instanceof Map ? Object.fromEntries(reply) : reply;
  if (Array.isArray(m)) {
    assert.equal(m.length, 2 * CHECK_FIELDS.length, `a flattened map, got ${JSON.stringify(m)}`);
    m = Object.fromEntries(CHECK_FIELDS.map((_, i) => [m[2 * i], m[2 * i + 1]]));
  }
  assert.deepEqual(Object.keys(m), CHECK_FIELDS, `a RESP3 map, got ${JSON.stringify(m)}`);
  return CHECK_FIELDS.map((f) => Number(m[f]));
}

for (const [name, a] of Object.entries(clients)) {
  const tag = name.replace(/\W+/g, '-');
  const key = (k) => `${tag}-${k}`;
  const bounded = { timeout: 20000 };

  test(`${name}: connects with defaults; a fresh key gets redis-cell's five integers`, bounded, async () => {
    const c = await a.connect(port);
    try {
      assert.equal(await a.call(c, ['PING']), 'PONG');
      assert.deepEqual(ints(await a.call(c, throttleArgs(key('user123')))), FRESH);
      assert.deepEqual(ints(await a.call(c, throttleArgs(key('user123')))).slice(0, 4), [0, 16, 14, -1]);
    } finally {
      await a.close(c);
    }
  });

  test(`${name}: a pipeline is answered in order`, bounded, async () => {
    const c = await a.connect(port);
    try {
      const replies = (await a.pipeline(c, Array.from({ length: 5 }, () => throttleArgs(key('pipe'))))).map(ints);
      assert.deepEqual(replies.map((r) => r[2]), [15, 14, 13, 12, 11]);
      for (const r of replies) assert.deepEqual([r[0], r[1], r[3]], [0, 16, -1]);
    } finally {
      await a.close(c);
    }
  });

  test(`${name}: MULTI/EXEC answers every queued command`, bounded, async () => {
    const c = await a.connect(port);
    try {
      const replies = await a.multi(c, [throttleArgs(key('multi')), throttleArgs(key('multi'))]);
      assert.equal(replies.length, 2);
      assert.deepEqual(ints(replies[0]), FRESH);
      assert.deepEqual(ints(replies[1]).slice(0, 4), [0, 16, 14, -1]);
    } finally {
      await a.close(c);
    }
  });

  test(`${name}: DEL counts the keys that existed and the key starts fresh`, bounded, async () => {
    const c = await a.connect(port);
    try {
      await a.call(c, throttleArgs(key('del')));
      await a.call(c, throttleArgs(key('del')));
      assert.equal(Number(await a.call(c, ['DEL', key('del'), key('never-seen')])), 1);
      assert.deepEqual(ints(await a.call(c, throttleArgs(key('del')))), FRESH);
    } finally {
      await a.close(c);
    }
  });

  test(`${name}: AUTH: NOAUTH before it, a wrong password fails, the right one works`, bounded, async () => {
    const open = await a.connect(authPort).catch((e) => e);
    if (open instanceof Error) {
      // A client whose connect runs a command fails at once: HELLO 3 gets Redis's "NOAUTH HELLO
      // must be called with the client already authenticated, ...", ioredis 5's INFO ready
      // check "NOAUTH Authentication required.".
      assert.match(open.message, /^NOAUTH (Authentication required\.|HELLO must be called)/);
    } else {
      try {
        assert.equal(await a.call(open, ['PING']), 'PONG');  // no password needed (probes)
        await assert.rejects(a.call(open, ['ECHO', 'x']), /NOAUTH Authentication required/);
        assert.equal(await a.call(open, ['AUTH', password]), 'OK');
        assert.equal(await a.call(open, ['PING']), 'PONG');
      } finally {
        await a.close(open);
      }
    }
    await assert.rejects(a.connect(authPort, { password: 'not-the-password' }), /WRONGPASS invalid username-password pair/);
    const c = await a.connect(authPort, { password });
    try {
      assert.deepEqual(ints(await a.call(c, throttleArgs(key('auth')))), FRESH);
    } finally {
      await a.close(c);
    }
  });

  test(`${name}: SLUICE.CHECK allows up to the rule, then denies`, bounded, async () => {
    const c = await a.connect(port);
    try {
      const got = [];
      for (let i = 0; i < 4; i++) {
        got.push(checkFields(await a.call(c, ['SLUICE.CHECK', 'api', 'user', key('ann')]), a.resp3));
      }
      // allowed, limit, remaining, retry_after_s, reset_s
      assert.deepEqual(got.map((r) => r.slice(0, 3)), [[1, 3, 2], [1, 3, 1], [1, 3, 0], [0, 3, 0]]);
      assert.ok(got[3][3] > 0, 'a denied check has a retry after');
    } finally {
      await a.close(c);
    }
  });
}
