// Browser test of the admin port's dashboard (/ui): a real sluiced on free loopback ports, checks
// sent to it over HTTP (/v1/check), and the page opened in headless Chromium (Debian's chromium
// binary, driven by playwright-core). The page must show the checks sent (per-rule totals, SVG
// paths), the key over its limit and the override set, and must redraw when more checks arrive.
// Then a cluster of 3 sluiced (one config file each, node 1 the others' seed): the page of node 1
// must show each rule's decisions summed over the 3 members with one row per member, the members'
// states, and, once node 3 is killed, node 3 as not answering and totals that cover 2 of 3.
//
//   SLUICED_BIN=build/daemon/sluiced node --test dashboard.test.mjs      (tests/ui/run.sh does it)
//   SLUICE_UI_SCREENSHOT=docs/dashboard.png    also: send mixed traffic for SLUICE_UI_TRAFFIC_S
//                                              seconds (default 120), then save a screenshot
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

import { freePort } from '../support/free_port.mjs';

const sluicedBin = process.env.SLUICED_BIN;
const chromiumBin = process.env.SLUICE_CHROMIUM || '/usr/bin/chromium';
const screenshot = process.env.SLUICE_UI_SCREENSHOT || '';

// One domain, two rules: an enforcing limit per API key and a dry-run one per user (a dry-run
// roll-out: measure who would be denied before enforcing).
const RULES = `domains:
  - name: api
    rules:
      - name: per-key
        key: [api_key]
        limits: [5/1m]
      - name: per-user-trial
        key: [user]
        limits: [3/1m]
        mode: dry-run
`;

const state = { dir: null, child: null, exited: null, admin: null, browser: null, failed: false };
// The cluster's nodes: { name, child, exited, admin, log }.
const cluster = [];

function sluicedLog(file = 'sluiced.log') {
  try {
    return fs.readFileSync(path.join(state.dir, file), 'utf8');
  } catch {
    return '(no log)';
  }
}

// Records a started sluiced's pid for tests/ui/run.sh's guard (one per line).
function notePid(pid) {
  if (process.env.SLUICE_UI_PIDFILE) fs.appendFileSync(process.env.SLUICE_UI_PIDFILE, `${pid}\n`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// fetch with a 5 s deadline, to node `admin` (default: the single node's admin port).
async function call(method, target, body, admin = state.admin) {
  const res = await fetch(`http://127.0.0.1:${admin}${target}`, {
    method,
    headers: body ? { 'content-type': 'application/json' } : {},
    body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(5000),
  });
  return { status: res.status, json: await res.json() };
}

// One check; true when allowed (200), false when denied (429).
async function check(descriptors, admin = state.admin) {
  const r = await call('POST', '/v1/check', { domain: 'api', descriptors }, admin);
  assert.ok(r.status === 200 || r.status === 429, `check answered ${r.status}: ${JSON.stringify(r.json)}`);
  return r.status === 200;
}

// Last resort, when this process ends or is interrupted before after() has run.
const killSluiced = () => {
  if (state.child && !state.exited) state.child.kill('SIGKILL');
  for (const n of cluster) if (!n.exited) n.child.kill('SIGKILL');
};
process.on('exit', killSluiced);
process.on('SIGINT', () => { killSluiced(); process.exit(130); });
process.on('SIGTERM', () => { killSluiced(); process.exit(143); });

before(async () => {
  assert.ok(sluicedBin && fs.existsSync(sluicedBin), `SLUICED_BIN (${sluicedBin}) is not sluiced: build first`);
  assert.ok(fs.existsSync(chromiumBin), `${chromiumBin} not found (deploy/setup.sh installs chromium)`);
  state.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-ui-'));
  fs.writeFileSync(path.join(state.dir, 'rules.yaml'), RULES);
  state.admin = await freePort();
  const log = fs.openSync(path.join(state.dir, 'sluiced.log'), 'w');
  state.child = spawn(sluicedBin, [
    '--udp', '', '--tcp', '', '--grpc', '', '--resp', '', '--data-dir', '',
    '--admin', `127.0.0.1:${state.admin}`,
    '--rules', path.join(state.dir, 'rules.yaml'),
    '--threads', '1', '--log-level', 'warn',
  ], { stdio: ['ignore', log, log] });
  fs.closeSync(log);
  state.child.once('exit', (code, signal) => { state.exited = { code, signal }; });
  notePid(state.child.pid);

  // Up to 100 tries 100 ms apart: /healthz answers.
  let last = 'no answer';
  for (let i = 0; i < 100 && !state.exited; i++) {
    try {
      const res = await fetch(`http://127.0.0.1:${state.admin}/healthz`, { signal: AbortSignal.timeout(500) });
      if (res.ok) break;
      last = `HTTP ${res.status}`;
    } catch (e) {
      last = e.message;
    }
    await sleep(100);
    if (i === 99) throw new Error(`sluiced did not answer /healthz (last: ${last}):\n${sluicedLog()}`);
  }
  if (state.exited) throw new Error(`sluiced exited (${JSON.stringify(state.exited)}):\n${sluicedLog()}`);

  state.browser = await chromium.launch({
    executablePath: chromiumBin,
    headless: true,
    timeout: 30000,
    // Root in a container: Chromium's sandbox needs user namespaces it may not have.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
});

after(async () => {
  await state.browser?.close();
  if (state.child && !state.exited) {
    state.child.kill('SIGTERM');
    const exited = new Promise((resolve) => state.child.once('exit', resolve));
    if ((await Promise.race([exited, sleep(5000).then(() => 'timeout')])) === 'timeout') state.child.kill('SIGKILL');
  }
  for (const n of cluster) {
    if (n.exited) continue;
    n.child.kill('SIGTERM');
    const exited = new Promise((resolve) => n.child.once('exit', resolve));
    if ((await Promise.race([exited, sleep(5000).then(() => 'timeout')])) === 'timeout') n.child.kill('SIGKILL');
  }
  if (state.failed) {
    console.log(`--- sluiced output\n${sluicedLog()}`);
    for (const n of cluster) console.log(`--- ${n.name} output\n${sluicedLog(n.log)}`);
  }
  if (state.dir) fs.rmSync(state.dir, { recursive: true, force: true });
});

// The text of a chart's total, as the page shows it (data-value), or null before it is drawn.
function total(page, rule, series) {
  return page.locator(`.chart[data-rule="${rule}"] [data-total="${series}"]`).getAttribute('data-value', { timeout: 1000 })
    .catch(() => null);
}

// Waits up to 15 s (three refreshes) until the chart of `rule` shows `expected` totals.
async function waitForTotals(page, rule, expected) {
  const deadline = Date.now() + 15000;
  let seen = {};
  while (Date.now() < deadline) {
    seen = {};
    for (const s of Object.keys(expected)) seen[s] = await total(page, rule, s);
    if (Object.entries(expected).every(([s, v]) => seen[s] === String(v))) return;
    await sleep(250);
  }
  assert.fail(`${rule}: the page shows ${JSON.stringify(seen)}, expected ${JSON.stringify(expected)} within 15 s`);
}

// Mixed traffic for the screenshot, about 16 checks a second in a slow wave: 400 shops mostly
// under their 5 a minute, one partner far over it, 300 users some of whom the dry-run rule would
// deny.
async function traffic(seconds) {
  const end = Date.now() + seconds * 1000;
  const pick = (n) => Math.floor(Math.random() * n);
  for (let tick = 0; Date.now() < end; tick++) {
    const wave = 1 + Math.round(3 * (1 + Math.sin(tick / 60)));
    const sends = [];
    for (let i = 0; i < wave; i++) sends.push(check({ api_key: `shop-${pick(400)}`, user: `u${pick(300)}` }));
    if (tick % 5 === 0) sends.push(check({ api_key: 'partner-9' }));
    await Promise.all(sends);
    await sleep(250);
  }
}

test('the dashboard draws the checks sent and redraws when more arrive', { timeout: 150000 + (screenshot ? 1000 * Number(process.env.SLUICE_UI_TRAFFIC_S || 120) : 0) }, async () => {
  try {
    // 8 checks of one key and user: per-key admits 5 and denies 3; the dry-run rule would deny
    // what passes its 3 a minute.
    let allowed = 0;
    for (let i = 0; i < 8; i++) if (await check({ api_key: 'k1', user: 'u1' })) allowed += 1;
    assert.equal(allowed, 5);
    const ov = await call('POST', '/v1/overrides', { domain: 'api', descriptors: { api_key: 'vip-1' }, limits: ['1000/1m'], ttl: '1h' });
    assert.equal(ov.status, 200, JSON.stringify(ov.json));

    const page = await state.browser.newPage({ viewport: { width: 1280, height: 1000 } });
    page.setDefaultTimeout(15000);
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    const res = await page.goto(`http://127.0.0.1:${state.admin}/ui`, { timeout: 15000 });
    assert.equal(res.status(), 200);

    await waitForTotals(page, 'api/per-key', { allowed: 5, denied: 3 });
    const dry = Number(await total(page, 'api/per-user-trial', 'would_deny'));
    assert.ok(dry >= 1, `the dry-run rule shows ${dry} would-deny`);

    // The rate lines: drawn once a second sample exists (at most 5 s after start, then a refresh).
    const allowedPath = page.locator('.chart[data-rule="api/per-key"] path[data-series="allowed"]');
    await allowedPath.waitFor({ state: 'attached', timeout: 15000 });
    assert.match(await allowedPath.getAttribute('d'), /^M[\d.]+,[\d.]+/);
    await page.locator('.chart[data-rule="api/per-key"] path[data-series="denied"]').waitFor({ state: 'attached', timeout: 15000 });

    // The key over its limit and the override, as text in their tables.
    const over = page.locator('#top tbody tr[data-state="over"]', { hasText: 'api_key=k1' });
    await over.waitFor({ timeout: 15000 });
    assert.match(await over.innerText(), /api\/per-key/);
    const ovRow = page.locator('#overrides tbody tr', { hasText: 'api_key=vip-1' });
    await ovRow.waitFor({ timeout: 15000 });
    assert.match(await ovRow.innerText(), /1000\/1m/);
    assert.match(await page.locator('#cluster-summary').innerText(), /single node/);

    // More checks of a fresh key: the totals move on the next refreshes.
    let more = 0;
    for (let i = 0; i < 4; i++) if (await check({ api_key: 'k2', user: 'u2' })) more += 1;
    assert.equal(more, 4);
    await waitForTotals(page, 'api/per-key', { allowed: 9, denied: 3 });

    if (screenshot) {
      await traffic(Number(process.env.SLUICE_UI_TRAFFIC_S || 120));
      await sleep(6000);  // one more sample and refresh
      await page.screenshot({ path: screenshot, fullPage: true });
      console.log(`screenshot: ${screenshot}`);
    }
    assert.deepEqual(errors, [], 'no script errors on the page');
    await page.close();
  } catch (e) {
    state.failed = true;
    throw e;
  }
});

// Starts node i (1-based) of a 3-node cluster from a config file: its own check, admin and peer
// ports on loopback, node 1 the others' seed, no data directory.
async function startClusterNode(i, ports) {
  const name = `node-${i}`;
  const cfg = path.join(state.dir, `${name}.yaml`);
  fs.writeFileSync(cfg, [
    `udp: 127.0.0.1:${ports[i - 1].check}`,
    `tcp: 127.0.0.1:${ports[i - 1].check}`,
    `admin: 127.0.0.1:${ports[i - 1].admin}`,
    `grpc: ""`, `resp: ""`, `data_dir: ""`, `threads: 1`, `log_level: warn`,
    `rules: ${path.join(state.dir, 'rules.yaml')}`,
    'cluster:',
    `  node_id: ${i}`,
    `  name: ${name}`,
    `  listen: 127.0.0.1:${ports[i - 1].peer}`,
    '  secret: "sluice-ui-test-cluster-secret-0123456789abcdef"',
    '  probe_interval_ms: 300',
    ...(i > 1 ? [`  seeds: ["127.0.0.1:${ports[0].peer}"]`] : []),
    '',
  ].join('\n'));
  const logName = `${name}.log`;
  const log = fs.openSync(path.join(state.dir, logName), 'w');
  const child = spawn(sluicedBin, ['--config', cfg], { stdio: ['ignore', log, log] });
  fs.closeSync(log);
  const n = { name, child, exited: null, admin: ports[i - 1].admin, log: logName };
  child.once('exit', (code, signal) => { n.exited = { code, signal }; });
  notePid(child.pid);
  cluster.push(n);
  for (let k = 0; k < 100 && !n.exited; k++) {
    try {
      if ((await fetch(`http://127.0.0.1:${n.admin}/healthz`, { signal: AbortSignal.timeout(500) })).ok) return n;
    } catch { /* not up yet */ }
    await sleep(100);
  }
  throw new Error(`${name} did not answer /healthz (${JSON.stringify(n.exited)}):\n${sluicedLog(logName)}`);
}

// Waits up to 20 s until every node lists the 3 members alive.
async function waitConverged() {
  let seen = '';
  for (const deadline = Date.now() + 20000; Date.now() < deadline;) {
    const views = await Promise.all(cluster.map((n) => call('GET', '/v1/cluster', undefined, n.admin).catch(() => null)));
    seen = JSON.stringify(views.map((v) => v?.json?.members?.map((m) => `${m.name}:${m.state}`)));
    if (views.every((v) => v && v.json.members.length === 3 && v.json.members.every((m) => m.state === 'alive'))) return;
    await sleep(200);
  }
  assert.fail(`the cluster did not converge within 20 s: ${seen}`);
}

// The cells of a table row, as the page shows them.
const cells = (locator) => locator.locator('td').allInnerTexts();

// Waits up to 15 s (three refreshes) until `probe` (async, returns a value) satisfies `ok`.
async function waitFor(what, probe, ok) {
  let last;
  for (const deadline = Date.now() + 15000; Date.now() < deadline;) {
    last = await probe().catch((e) => `(${e.message})`);
    if (ok(last)) return last;
    await sleep(250);
  }
  assert.fail(`${what}: the page shows ${JSON.stringify(last)}`);
}

test('the cluster view sums every member per rule, shows each member and its state, and a member down', { timeout: 120000 }, async () => {
  try {
    const ports = [];
    for (let i = 0; i < 3; i++) ports.push({ check: await freePort(), admin: await freePort(), peer: await freePort() });
    for (let i = 1; i <= 3; i++) await startClusterNode(i, ports);
    await waitConverged();

    // Checks through every node's door; each is decided once, by whichever node the cluster
    // routes it to, so the cluster's totals are exactly the answers the checks got.
    const sent = { allowed: 0, denied: 0 };
    for (let k = 0; k < 15; k++) {
      const n = cluster[k % 3];
      const ok = await check({ api_key: `c${k % 2}`, user: `cu${k % 2}` }, n.admin);
      sent[ok ? 'allowed' : 'denied'] += 1;
    }
    assert.ok(sent.allowed > 0 && sent.denied > 0, JSON.stringify(sent));

    const page = await state.browser.newPage({ viewport: { width: 1280, height: 1400 } });
    page.setDefaultTimeout(15000);
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    assert.equal((await page.goto(`http://127.0.0.1:${cluster[0].admin}/ui`, { timeout: 15000 })).status(), 200);

    // The sum row: rule, "all 3", allowed, denied, shadow-denied, would-deny.
    const sumRow = page.locator('#cluster-top tr.sum[data-rule="api/per-key"]');
    const sum = await waitFor('the per-key sum row', () => cells(sumRow),
      (c) => Array.isArray(c) && c[2] === String(sent.allowed) && c[3] === String(sent.denied));
    assert.equal(sum[1], 'all 3');
    // One row per member, whose counts add up to the sum.
    const memberRows = page.locator('#cluster-top tr.member[data-rule="api/per-key"]');
    assert.equal(await memberRows.count(), 3);
    let allowed = 0, denied = 0;
    const names = [];
    for (let i = 0; i < 3; i++) {
      const c = await cells(memberRows.nth(i));
      names.push(c[1]);
      allowed += Number(c[2]);
      denied += Number(c[3]);
    }
    assert.deepEqual(names, ['node-1', 'node-2', 'node-3']);
    assert.deepEqual({ allowed, denied }, sent);
    // The dry-run rule's would-denies, summed too.
    const trial = await cells(page.locator('#cluster-top tr.sum[data-rule="api/per-user-trial"]'));
    assert.ok(Number(trial[5]) >= 1, `per-user-trial would-deny: ${trial}`);

    // The members: all three alive and answering, node 1 being this node.
    for (const n of cluster) {
      const r = page.locator(`#cluster-members tr[data-member="${n.name}"]`);
      assert.equal(await r.getAttribute('data-state'), 'alive');
      assert.equal(await r.getAttribute('data-answered'), 'true');
    }
    assert.match((await cells(page.locator('#cluster-members tr[data-member="node-1"]')))[1], /this node/);
    assert.match(await page.locator('#cluster-top-summary').innerText(), /3 of 3 members answered/);

    // Node 3 killed: it shows as not answering, with the reason, and the totals cover 2 of 3.
    cluster[2].child.kill('SIGKILL');
    const down = page.locator('#cluster-members tr[data-member="node-3"]');
    await waitFor('node-3 down', () => down.getAttribute('data-answered'), (v) => v === 'false');
    assert.match((await cells(down))[4], /no answer: .+/);
    assert.match(await page.locator('#cluster-top-summary').innerText(), /2 of 3 members answered/);
    assert.equal(await page.locator('#cluster-top tr.sum[data-rule="api/per-key"] td').nth(1).innerText(), 'all 2');
    // Membership comes to call it suspect, then dead.
    await waitFor('node-3 suspect or dead', () => down.getAttribute('data-state'), (v) => v === 'suspect' || v === 'dead');

    assert.deepEqual(errors, [], 'no script errors on the page');
    await page.close();
  } catch (e) {
    state.failed = true;
    throw e;
  }
});
