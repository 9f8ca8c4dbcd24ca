// The Sluice dashboard (/ui): polls the admin port's /v1/ui/* every 5 s and draws per-rule rate
// charts as plain SVG, and the top keys, overrides and cluster members as tables; the cluster's
// totals per rule come from /v1/ui/cluster/top (this node asks every member), fetched apart so a
// slow member never holds up the rest of the page. Every string
// from the node (rule names, keys, descriptors: client input among them) goes into the page as
// text (textContent), never as markup.
"use strict";

const REFRESH_MS = 5000;
const FETCH_TIMEOUT_MS = 4000;
const SERIES = ["allowed", "denied", "shadow_denied", "would_deny"];
const SVG_NS = "http://www.w3.org/2000/svg";
// Chart geometry in SVG user units (the SVG scales to its box).
const W = 600, H = 170, LEFT = 48, RIGHT = 8, TOP = 8, BOTTOM = 22;

function el(tag, attrs = {}, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG_NS, tag.slice(4))
                                   : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

async function getJson(path) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  try {
    const res = await fetch(path, { signal: ctl.signal, cache: "no-store" });
    if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
    return await res.json();
  } finally {
    clearTimeout(timer);
  }
}

// A round upper bound for the y axis: 1, 2, 5 x 10^n at or above max.
function niceMax(max) {
  if (!(max > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(max)));
  for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
  return 10 * p;
}

function fmtRate(v) {
  if (v >= 100) return v.toFixed(0);
  if (v >= 10) return v.toFixed(1);
  return v.toFixed(2).replace(/\.?0+$/, "") || "0";
}

function fmtAge(ms) {
  if (ms === null || ms === undefined) return "never";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
}

// ---- rate charts ------------------------------------------------------------------------------

const charts = new Map();  // rule name -> {root, svg, totals}

function makeChart(rule) {
  const root = el("div", { class: "chart", "data-rule": rule });
  root.append(el("h3", {}, rule));
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `decisions per second of ${rule}` });
  root.append(svg);
  const totals = el("p", { class: "totals" });
  for (const s of SERIES) {
    const label = s.replace("_", "-");
    const span = el("span", { "data-total": s });
    span.append(`${label} `, el("b", {}, "0"), "  ");
    totals.append(span);
  }
  root.append(totals);
  return { root, svg, totals };
}

function drawChart(chart, rates, rule) {
  const svg = chart.svg;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const t = rates.t;
  const to = rates.now_ms, from = to - rates.span_ms;
  let max = 0;
  for (const s of SERIES) for (const v of rule[s]) max = Math.max(max, v);
  const ymax = niceMax(max);
  const x = (ms) => LEFT + ((ms - from) / (to - from)) * (W - LEFT - RIGHT);
  const y = (v) => TOP + (1 - v / ymax) * (H - TOP - BOTTOM);

  // Grid: four horizontal lines with their values, and the time axis.
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4;
    svg.append(el("svg:line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
    svg.append(el("svg:text", { class: "axis", x: LEFT - 4, y: y(v) + 4, "text-anchor": "end" }, `${fmtRate(v)}/s`));
  }
  for (const [ms, label] of [[from, "-15 min"], [from + 300000, "-10 min"], [from + 600000, "-5 min"], [to, "now"]]) {
    const anchor = ms === from ? "start" : ms === to ? "end" : "middle";
    svg.append(el("svg:text", { class: "axis", x: x(ms), y: H - 6, "text-anchor": anchor }, label));
  }
  for (const s of SERIES) {
    const values = rule[s];
    if (values.length === 0 || (s !== "allowed" && values.every((v) => v === 0))) continue;
    let d = "";
    values.forEach((v, i) => { d += `${i ? "L" : "M"}${x(t[i]).toFixed(1)},${y(v).toFixed(1)}`; });
    // One point alone draws nothing as a line: make it a short dash.
    if (values.length === 1) d += `h-4`;
    const path = el("svg:path", { class: "series", "data-series": s, "data-points": values.length, d });
    path.append(el("svg:title", {}, `${s.replace("_", "-")}: now ${fmtRate(values[values.length - 1])}/s`));
    svg.append(path);
  }
  for (const s of SERIES) {
    const span = chart.totals.querySelector(`[data-total="${s}"]`);
    span.dataset.value = rule.totals[s];
    span.querySelector("b").textContent = rule.totals[s];
    span.hidden = s !== "allowed" && s !== "denied" && rule.totals[s] === 0;
  }
}

function renderRates(rates) {
  const box = document.getElementById("rates");
  const empty = box.querySelector(".empty");
  if (empty && rates.rules.length) empty.remove();
  for (const rule of rates.rules) {
    let chart = charts.get(rule.rule);
    if (!chart) {
      chart = makeChart(rule.rule);
      charts.set(rule.rule, chart);
      box.append(chart.root);
    }
    drawChart(chart, rates, rule);
  }
}

// ---- tables -----------------------------------------------------------------------------------

function fillTable(id, rows, emptyId) {
  const table = document.getElementById(id);
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
  table.classList.toggle("filled", rows.length > 0);
  if (emptyId) document.getElementById(emptyId).classList.toggle("hidden", rows.length > 0);
}

function row(cells, attrs = {}) {
  const tr = el("tr", attrs);
  for (const c of cells) {
    const [text, cls] = Array.isArray(c) ? c : [c, ""];
    tr.append(el("td", cls ? { class: cls } : {}, text));
  }
  return tr;
}

function renderTop(top) {
  fillTable("top", top.keys.map((k) => row([
    [k.rule, "mono"], [k.key, "mono"], k.state, [`${k.used} / ${k.limit}`, "num"],
    [k.percent.toFixed(0), "num"], [k.exceeded, "num"], k.window,
  ], { "data-state": k.state })), "top-empty");
}

function renderOverrides(ov) {
  fillTable("overrides", ov.overrides.map((o) => row([
    o.domain,
    [Object.entries(o.descriptors).map(([k, v]) => `${k}=${v}`).join(" "), "mono"],
    o.limits.map((l) => `${l.limit}/${l.window}`).join(", ") || "(rule's)",
    o.mode || "(rule's)", o.plan || "",
    o.ttl_left_s === null ? "never" : `${o.ttl_left_s} s`,
  ])), "overrides-empty");
}

function renderCluster(c) {
  const summary = document.getElementById("cluster-summary");
  if (!c.enabled) {
    summary.textContent = "A single node (no cluster).";
    fillTable("cluster", []);
    return;
  }
  summary.textContent = `Seen from node ${c.self} (${c.name}): ${c.join_state}, ` +
    `${c.members_reachable} of ${c.members_expected} members in reach, ${c.replicas} replicas per key.`;
  fillTable("cluster", c.members.map((m) => row([
    [m.id, "num"], m.self ? `${m.name} (this node)` : m.name, [`${m.host}:${m.peer_port}`, "mono"],
    m.state, [`${(m.share * 100).toFixed(1)} %`, "num"], m.self ? "" : fmtAge(m.last_heard_ms),
    m.self ? "" : fmtAge(m.sync_lag_ms),
  ], { "data-state": m.state })));
}

function fmtUptime(s) {
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

// The cluster view: the members as this node's membership knows them, whether each answered (and
// why not), and per rule the sum over those that did with one row per member.
function renderClusterTop(v) {
  const summary = document.getElementById("cluster-top-summary");
  summary.dataset.answered = v.members_answered;
  summary.dataset.total = v.members_total;
  summary.textContent = v.cluster
    ? `${v.members_answered} of ${v.members_total} members answered within ${v.timeout_ms} ms; the totals cover those.`
    : "A single node (no cluster): its own counts.";
  summary.classList.toggle("warn", v.members_answered < v.members_total);
  fillTable("cluster-members", v.members.map((m) => row([
    [m.id, "num"], m.self ? `${m.name || "this node"} (this node)` : m.name, [m.address, "mono"],
    m.state,
    m.answered ? (m.ready === false ? `answered, not ready: ${m.not_ready}` : "answered")
               : `no answer: ${m.error}`,
    m.answered ? fmtUptime(m.uptime_s) : "", [m.answered ? m.checks : "", "num"],
  ], { "data-member": m.name, "data-state": m.state, "data-answered": m.answered })));
  const rows = [];
  for (const r of v.rules) {
    if (SERIES.every((s) => r[s] === 0)) continue;
    rows.push(row([[r.rule, "mono"], `all ${r.nodes.length}`, ...SERIES.map((s) => [r[s], "num"])],
      { class: "sum", "data-rule": r.rule, "data-node": "" }));
    for (const n of r.nodes) {
      rows.push(row([["", "mono"], n.name || "this node", ...SERIES.map((s) => [n[s], "num"])],
        { class: "member", "data-rule": r.rule, "data-node": n.name }));
    }
  }
  fillTable("cluster-top", rows, "cluster-top-empty");
}

async function refreshClusterTop() {
  try {
    renderClusterTop(await getJson("/v1/ui/cluster/top"));
  } catch (e) {
    const summary = document.getElementById("cluster-top-summary");
    summary.textContent = `cannot gather the cluster view: ${e.message}`;
    summary.classList.add("warn");
  }
}

// ---- the refresh loop -------------------------------------------------------------------------

let refreshes = 0;

async function refresh() {
  const status = document.getElementById("status");
  const clusterTop = refreshClusterTop();
  try {
    const [rates, top, ov, cluster] = await Promise.all([
      getJson("/v1/ui/rates"), getJson("/v1/ui/top"), getJson("/v1/ui/overrides"), getJson("/v1/ui/cluster"),
    ]);
    renderRates(rates);
    renderTop(top);
    renderOverrides(ov);
    renderCluster(cluster);
    refreshes += 1;
    document.body.dataset.refreshes = refreshes;
    status.dataset.state = "ok";
    status.textContent = `updated ${new Date(rates.now_ms).toLocaleTimeString()}, every ${REFRESH_MS / 1000} s`;
  } catch (e) {
    status.dataset.state = "error";
    status.textContent = `cannot reach the node: ${e.message}`;
  }
  await clusterTop;
  setTimeout(refresh, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", refresh);
