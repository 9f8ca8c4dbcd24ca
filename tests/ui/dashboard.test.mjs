// Browser test of the admin port's dashboard (/ui): a real sluiced on free loopback ports, checks
// sent to it over HTTP (/v1/check), and the page opened in headless Chromium (Debian's chromium
// binary, driven by playwright-core). The page must show the checks sent (per-rule totals, SVG
// paths), the key over its limit and the override set, and must redraw when more checks arrive.
//
//   SLUICED_BIN=build/daemon/sluiced node --test dashboard.test.mjs      (tests/ui/run.sh does it)
//   SLUICE_UI_SCREENSHOT=docs/dashboard.png    also: send mixed traffic for SLUICE_UI_TRAFFIC_S
//                                              seconds (default 120), then save a screenshot
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

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

async function freePort() {
  const s = net.createServer();
  await new Promise((resolve, reject) => {
    s.once('error', reject);
    s.listen(0, '127.0.0.1', resolve);
  });
  const { port } = s.address();
  await new Promise((resolve) => s.close(resolve));
  return port;
}

function sluicedLog() {
  try {
    return fs.readFileSync(path.join(state.dir, 'sluiced.log'), 'utf8');
  } catch {
    return '(no log)';
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// fetch with a 5 s deadline.
async function call(method, target, body) {
  const res = await fetch(`http://127.0.0.1:${state.admin}${target}`, {
    method,
    headers: body ? { 'content-type': 'application/json' } : {},
    body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.timeout(5000),
  });
  return { status: res.status, json: await res.json() };
}

// One check; true when allowed (200), false when denied (429).
async function check(descriptors) {
  const r = await call('POST', '/v1/check', { domain: 'api', descriptors });
  assert.ok(r.status === 200 || r.status === 429, `check answered ${r.status}: ${JSON.stringify(r.json)}`);
  return r.status === 200;
}

// Last resort, when this process ends or is interrupted before after() has run.
const killSluiced = () => state.child && !state.exited && state.child.kill('SIGKILL');
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
  if (process.env.SLUICE_UI_PIDFILE) fs.writeFileSync(process.env.SLUICE_UI_PIDFILE, `${state.child.pid}\n`);

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
  if (state.failed) console.log(`--- sluiced output\n${sluicedLog()}`);
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
