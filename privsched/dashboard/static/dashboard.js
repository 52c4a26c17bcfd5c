// The dashboard's pages: fetch JSON from the API with the user's token, build the DOM with
// textContent only (user text is never parsed as HTML), and poll so the view stays current.
"use strict";

const POLL_MS = 2000;
const BUCKETS = ["consumed", "allocated", "unlocked", "locked"];
const view = document.getElementById("view");
let timer = null;
let shown = "";

// Replaces the view only when what it shows changed, so that polling neither flickers nor
// swaps out an element the user is about to click.
function render(data, build) {
  const key = location.hash + "\n" + JSON.stringify(data);
  if (key === shown) { return; }
  shown = key;
  view.replaceChildren(...build().filter((node) => node !== null));
}

function token() { return sessionStorage.getItem("privsched-token") || ""; }

async function getJSON(path, method) {
  const response = await fetch(path, { method: method || "GET", headers: { Authorization: "Bearer " + token() } });
  if (response.status === 401) { showLogin("Token refused (401)."); throw new Error("unauthorised"); }
  const body = await response.json();
  if (!response.ok) { throw new Error(`${response.status}: ${body.error || body.detail || response.statusText}`); }
  return body;
}

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (name === "text") { node.textContent = value; } else { node.setAttribute(name, value); }
  }
  for (const child of children) { if (child !== null && child !== undefined) { node.append(child); } }
  return node;
}

function num(value, digits) {
  if (value === null || value === undefined) { return ""; }
  return Number(value).toPrecision(digits || 4).replace(/\.?0+(e|$)/, "$1");
}

function when(seconds) { return seconds ? new Date(seconds * 1000).toLocaleTimeString() : ""; }

function table(headers, rows, rowClass) {
  const head = el("tr", {}, ...headers.map((h) => el("th", { text: h })));
  const body = rows.map((cells, i) => {
    const tr = el("tr", rowClass ? { class: rowClass(i) } : {});
    for (const cell of cells) {
      tr.append(cell instanceof Node ? el("td", {}, cell) : el("td", { text: String(cell ?? "") }));
    }
    return tr;
  });
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
}

function bar(fractions) {
  const node = el("div", { class: "bar", title: BUCKETS.map((b) => `${b} ${(100 * fractions[b]).toFixed(1)}%`).join(", ") });
  for (const bucket of BUCKETS) {
    const span = el("span", { class: bucket, "data-bucket": bucket, "data-fraction": String(fractions[bucket]) });
    span.style.width = (100 * fractions[bucket]) + "%";
    node.append(span);
  }
  return node;
}

function legend() {
  const node = el("p", { class: "legend", text: "Share of capacity at the binding dimension (RDP: the best order):" });
  for (const bucket of BUCKETS) { node.append(el("span", { class: bucket }), bucket); }
  return node;
}

function historyChart(history) {
  const ns = "http://www.w3.org/2000/svg";
  const width = 480, height = 120;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "history");
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  if (history.length > 0) {
    const start = history[0].at, span = Math.max(history[history.length - 1].at - start, 1e-9);
    for (const [key, colour] of [["given_out", "#e67e22"], ["consumed", "#c0392b"]]) {
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("fill", "none"); line.setAttribute("stroke", colour); line.setAttribute("stroke-width", "2");
      line.setAttribute("points", history.map((p) =>
        `${(width * (p.at - start) / span).toFixed(1)},${(height - height * Math.min(p[key], 1)).toFixed(1)}`).join(" "));
      svg.append(line);
    }
  }
  return svg;
}

async function showBlocks() {
  const datasets = await getJSON("/v1/dashboard/blocks");
  render(datasets, () => blocksPage(datasets));
}

function blocksPage(datasets) {
  const parts = [el("h2", { text: "Datasets and blocks" }), legend()];
  for (const dataset of datasets) {
    parts.push(el("h3", { text: `${dataset.name} (${dataset.accounting}, ε_G=${num(dataset.epsilon)}, δ_G=${num(dataset.delta)} per ${dataset.unit})` }));
    parts.push(table(["block", "state", "budget", "remaining ε", "remaining δ", "dimension"],
      dataset.blocks.map((b) => [b.key, b.state, bar(b.bar), num(b.remaining.epsilon), num(b.remaining.delta, 3), b.bar.dimension]),
      (i) => "block " + dataset.blocks[i].state));
    parts.push(el("p", { text: "Budget given out (orange) and consumed (red) over time, mean share per block:" }));
    parts.push(historyChart(dataset.history));
  }
  return parts;
}

function pipelineLink(row) { return el("a", { href: "#pipeline/" + row.id, text: String(row.id) }); }

async function showQueue() {
  const queue = await getJSON("/v1/dashboard/queue");
  render(queue, () => [
    queue.condition ? el("p", { id: "condition", class: "error banner", text: `scheduler: ${queue.condition}; retrying` }) : null,
    el("h2", { text: `Pending (${queue.pending.length})` }),
    table(["id", "name", "dataset", "owner", "submitted", "blocks", "reason"],
      queue.pending.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, when(p.submitted_at), p.blocks, p.reason || ""])),
    el("h2", { text: `Granted, waiting for compute (${queue.granted.length})` }),
    table(["id", "name", "dataset", "owner", "granted", "reason"],
      queue.granted.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, when(p.granted_at), p.reason || ""])),
    el("h2", { text: `Running (${queue.running.length})` }),
    table(["id", "name", "dataset", "owner", "started", "placement"],
      queue.running.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, when(p.started_at), JSON.stringify(p.placement || {})])),
    el("h2", { text: "Recently ended" }),
    table(["id", "name", "dataset", "owner", "state", "ended", "message"],
      queue.recent.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, p.state, when(p.finished_at), p.message || ""])),
  ]);
}

let cancelResult = "";

async function cancel(id) {
  try {
    const answer = await getJSON(`/v1/pipelines/${encodeURIComponent(id)}/cancel`, "POST");
    cancelResult = "cancel: " + (answer.outcome || answer.state || "done");
  } catch (error) {
    cancelResult = "cancel refused: " + error.message;
  }
  refresh();
}

async function showPipeline(id) {
  const p = await getJSON("/v1/dashboard/pipelines/" + encodeURIComponent(id));
  const cancelButton = el("button", { id: "cancel", text: "Cancel" });
  cancelButton.addEventListener("click", () => cancel(p.id));
  const ended = ["completed", "failed", "timed_out", "cancelled"].includes(p.state);
  render({ p, cancelResult }, () => [
    el("h2", { text: `Pipeline ${p.id}: ${p.name}` }),
    ended ? null : cancelButton,
    el("p", { id: "cancel-result", class: "error", text: cancelResult }),
    table(["state", "dataset", "owner", "submitted", "granted", "started", "ended", "message"],
      [[el("span", { id: "pipeline-state", text: p.state }), p.dataset, p.owner, when(p.submitted_at), when(p.granted_at),
        when(p.started_at), when(p.finished_at), p.message || ""]]),
    p.waiting ? el("p", { id: "waiting", text: `waiting: ${p.waiting}` }) : null,
    el("h3", { text: "Charged demand per block" }),
    table(["block", "demand ε", "demand δ", "consumed ε", "consumed δ"],
      p.demands.map((d) => [d.block, num(d.demand.epsilon), num(d.demand.delta, 3),
        d.consumed ? num(d.consumed.epsilon) : "", d.consumed ? num(d.consumed.delta, 3) : ""])),
    el("h3", { text: "Demand curve against the block's capacity" }),
    table(["dimension", "demand", "capacity"],
      (p.demands[0] ? p.demands[0].curve : []).map((c, i) => [c.dimension, num(c.value), num(p.demands[0].capacity[i].value)])),
    el("h3", { text: "Job" }), el("pre", { text: JSON.stringify(p.job, null, 2) }),
    el("h3", { text: "Released metrics" }),
    el("pre", { id: "metrics", text: p.metrics === null ? "(a code job's metrics are shown to its submitter and admins only)" : JSON.stringify(p.metrics, null, 2) }),
    el("h3", { text: "Log (end)" }),
    el("pre", { id: "log", text: p.log_tail === null ? "(this job's log is not shown to you: a code job's goes to its submitter and admins, a built-in job's to admins)" : p.log_tail }),
  ]);
}

async function showAudit() {
  const audit = await getJSON("/v1/dashboard/audit");
  render(audit, () => [
    el("h2", { text: "Audit" }),
    el("p", { id: "audit-result", class: audit.ok ? "ok" : "error",
      text: audit.ok ? `ok: ${audit.blocks} blocks, ${audit.events} events, every invariant holds`
                     : `${audit.violations.length} violation(s)` }),
    el("ul", {}, ...audit.violations.map((v) => el("li", { text: v }))),
    el("p", { text: "Event chain head (keep it elsewhere; privsched audit --expect HEAD checks it later):" }),
    el("pre", { id: "chain-head", text: audit.head }),
  ]);
}

function route() {
  if (!location.hash.startsWith("#pipeline/")) { cancelResult = ""; }
  const [page, argument] = (location.hash.slice(1) || "blocks").split("/");
  for (const name of ["blocks", "queue", "audit"]) {
    document.getElementById("nav-" + name).classList.toggle("current", name === page);
  }
  if (page === "queue") { return showQueue(); }
  if (page === "audit") { return showAudit(); }
  if (page === "pipeline") { return showPipeline(argument); }
  return showBlocks();
}

async function refresh() {
  try {
    await route();
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    if (error.message !== "unauthorised") { document.getElementById("updated").textContent = "error: " + error.message; }
  }
}

function showLogin(message) {
  clearInterval(timer);
  document.getElementById("login").hidden = false;
  document.getElementById("logout").hidden = true;
  document.getElementById("login-error").textContent = message || "";
  shown = "";
  view.replaceChildren();
}

function start() {
  document.getElementById("login").hidden = true;
  document.getElementById("logout").hidden = false;
  clearInterval(timer);
  refresh();
  timer = setInterval(refresh, POLL_MS);
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("privsched-token", document.getElementById("token").value);
  start();
});
document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem("privsched-token");
  showLogin("");
});
window.addEventListener("hashchange", refresh);
if (token()) { start(); } else { showLogin(""); }
