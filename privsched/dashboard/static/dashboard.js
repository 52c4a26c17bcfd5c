// The dashboard's pages: fetch JSON from the API with the user's token, build the DOM with
// textContent only (user text is never parsed as HTML), and poll so the view stays current.
// The page and its filters live in the address's hash (#pipelines?state=failed&page=2), so
// every view can be linked to and reloaded.
"use strict";

const POLL_MS = 2000;
const BUCKETS = ["consumed", "allocated", "unlocked", "locked"];
const PAGES = ["blocks", "pipelines", "queue", "teams", "audit"];
const view = document.getElementById("view");
let timer = null;
let shown = "";

// An HTTP refusal, with its status, shown as a page of its own.
class Refused extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// Replaces the view only when what it shows changed, so that polling neither flickers nor
// swaps out an element the user is about to click, and only while the address is still the
// one the data was asked for (``asked``: an answer that comes back after the user moved on
// is dropped, never shown as the new page); ``after`` runs once the nodes are in the page.
function render(asked, data, build, after) {
  if (location.hash !== asked) { return; }
  const key = location.hash + "\n" + JSON.stringify(data);
  if (key === shown) { return; }
  shown = key;
  view.replaceChildren(...build().filter((node) => node !== null));
  if (after) { after(); }
}

function token() { return sessionStorage.getItem("privsched-token") || ""; }

async function fetchWithToken(path, method) {
  const response = await fetch(path, { method: method || "GET", headers: { Authorization: "Bearer " + token() } });
  if (response.status === 401) { showLogin("Token refused (401)."); throw new Error("unauthorised"); }
  if (!response.ok) {
    let text = response.statusText;
    try { const body = await response.json(); text = body.error || body.detail || text; } catch (error) { /* not JSON */ }
    throw new Refused(response.status, String(text));
  }
  return response;
}

async function getJSON(path, method) { return (await fetchWithToken(path, method)).json(); }

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

function pct(value) { return value === null || value === undefined ? "" : Number(value).toFixed(1) + " %"; }

// A date and time, in UTC, as the server's clocks record them.
function when(seconds) {
  if (!seconds) { return ""; }
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function table(headers, rows, rowClass, id) {
  const head = el("tr", {}, ...headers.map((h) => el("th", { text: h })));
  const body = rows.map((cells, i) => {
    const tr = el("tr", rowClass ? { class: rowClass(i) } : {});
    for (const cell of cells) {
      tr.append(cell instanceof Node ? el("td", {}, cell) : el("td", { text: String(cell ?? "") }));
    }
    return tr;
  });
  return el("table", id ? { id } : {}, el("thead", {}, head), el("tbody", {}, ...body));
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
  const node = el("p", { class: "legend", text: "Share of each block's capacity (basic: the binding one of ε and δ; RDP: the best order):" });
  for (const bucket of BUCKETS) { node.append(el("span", { class: bucket }), bucket); }
  return node;
}

// The hash's page, argument and filters: "#pipelines?state=failed" -> ["pipelines", "", {state: "failed"}].
function location_() {
  const [path, query] = (location.hash.slice(1) || "blocks").split("?");
  const [page, ...rest] = path.split("/");
  return { page, argument: rest.map(decodeURIComponent).join("/"), params: new URLSearchParams(query || "") };
}

function hashFor(page, params) {
  const query = new URLSearchParams([...Object.entries(params)].filter(([, v]) => v !== null && v !== undefined && v !== "")).toString();
  return "#" + page + (query ? "?" + query : "");
}

function pipelineLink(row) { return el("a", { href: "#pipeline/" + row.id, class: "pipeline-link", text: String(row.id) }); }

// Links to a pipeline's blocks: all of them up to three, else the first and the last.
function blockLinks(dataset, keys) {
  const node = el("span", { class: "block-links" });
  const link = (key) => el("a", { href: hashFor("blocks", { dataset, block: key }), text: key });
  if (keys.length > 3) {
    node.append(link(keys[0]), " … ", link(keys[keys.length - 1]), ` (${keys.length} blocks)`);
    return node;
  }
  keys.forEach((key, i) => {
    if (i > 0) { node.append(", "); }
    node.append(link(key));
  });
  return node;
}

// -- blocks ---------------------------------------------------------------------------------

// A time axis tick in UTC: the time of day, with the date where the ticks span days.
function utcTick(seconds, ticks) {
  const text = new Date(seconds * 1000).toISOString();
  const span = ticks.length > 1 ? ticks[ticks.length - 1] - ticks[0] : 0;
  return span >= 86400 ? text.slice(5, 16).replace("T", " ") : text.slice(11, 19);
}

function historyChart(dataset) {
  const box = el("div", { class: "history", "data-dataset": dataset.name });
  if (dataset.history.length === 0) {
    box.append(el("p", { class: "empty", text: "No budget has moved on this dataset yet." }));
    return { box, draw: () => {} };
  }
  const data = [
    dataset.history.map((p) => p.at),
    dataset.history.map((p) => 100 * p.consumed),
    dataset.history.map((p) => 100 * p.given_out),
  ];
  const draw = () => new uPlot({
    title: `Budget over time: ${dataset.name}`,
    width: 760,
    height: 260,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    scales: { x: { time: true }, y: { range: [0, 100] } },
    axes: [
      { label: `time (UTC), from ${when(data[0][0])}`, space: 90, values: (u, ticks) => ticks.map((t) => utcTick(t, ticks)) },
      { label: "mean share of capacity", size: 60, values: (u, ticks) => ticks.map((t) => t + " %") },
    ],
    series: [
      { label: "time (UTC)", value: "{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}" },
      { label: "consumed", stroke: "#c0392b", width: 2, value: (u, v) => (v === null ? "" : v.toFixed(1) + " %") },
      { label: "given out (allocated + consumed)", stroke: "#e67e22", width: 2, value: (u, v) => (v === null ? "" : v.toFixed(1) + " %") },
    ],
  }, data, box);
  return { box, draw };
}

async function showBlocks(params) {
  const asked = location.hash;
  const datasets = await getJSON("/v1/dashboard/blocks");
  const selected = params.get("dataset");
  const shownSets = selected ? datasets.filter((d) => d.name === selected) : datasets;
  const charts = [];
  render(asked, datasets, () => {
    const parts = [el("h2", { text: "Datasets and blocks" })];
    if (selected) { parts.push(el("p", {}, `Dataset ${selected} only: `, el("a", { href: "#blocks", text: "show every dataset" }))); }
    parts.push(legend());
    for (const dataset of shownSets) {
      parts.push(el("h3", { text: `${dataset.name}: ${dataset.accounting} accounting, ε_G = ${num(dataset.epsilon)}, δ_G = ${num(dataset.delta)} per ${dataset.unit}` }));
      parts.push(el("p", { class: "note", text: "Used is allocated + consumed; used + left = 100 %. ε left is read at δ_G." }));
      parts.push(table(["block", "state", "budget", "used", "left", "ε left at δ_G", "read at", "pipelines"],
        dataset.blocks.map((b) => [b.key, b.state, bar(b.bar), pct(b.used_percent), pct(b.left_percent), num(b.remaining.epsilon),
          b.bar.dimension, el("a", { href: hashFor("pipelines", { dataset: dataset.name, search: b.key }), text: "pipelines" })]),
        (i) => "block " + dataset.blocks[i].state + (dataset.blocks[i].key === params.get("block") ? " selected" : "")));
      const chart = historyChart(dataset);
      charts.push(chart);
      parts.push(chart.box);
    }
    return parts;
  }, () => charts.forEach((chart) => chart.draw()));
}

// -- pipelines ------------------------------------------------------------------------------

function filterSelect(name, label, choices, value, params) {
  const select = el("select", { id: "filter-" + name, name }, el("option", { value: "", text: `every ${label}` }),
    ...choices.map((choice) => el("option", { value: choice, text: choice })));
  select.value = value || "";
  select.addEventListener("change", () => { location.hash = hashFor("pipelines", { ...Object.fromEntries(params), [name]: select.value, page: "" }); });
  return el("label", {}, label + " ", select);
}

async function showPipelines(params) {
  const asked = location.hash;
  const query = new URLSearchParams();
  for (const name of ["state", "owner", "dataset", "search", "page"]) { if (params.get(name)) { query.set(name, params.get(name)); } }
  const page = await getJSON("/v1/dashboard/pipelines?" + query.toString());
  render(asked, page, () => {
    const search = el("input", { id: "filter-search", type: "search", placeholder: "id, name, owner, block", value: params.get("search") || "" });
    const form = el("form", { id: "filters", class: "filters" },
      filterSelect("state", "state", page.choices.state, params.get("state"), params),
      filterSelect("owner", "owner", page.choices.owner, params.get("owner"), params),
      filterSelect("dataset", "dataset", page.choices.dataset, params.get("dataset"), params),
      el("label", {}, "search ", search), el("button", { type: "submit", text: "Search" }));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      location.hash = hashFor("pipelines", { ...Object.fromEntries(params), search: search.value.trim(), page: "" });
    });
    const first = (page.page - 1) * page.per_page + 1;
    const last = first + page.rows.length - 1;
    const move = (to, text, id) => (to < 1 || to > page.pages ? el("span", { class: "disabled", text })
      : el("a", { id, href: hashFor("pipelines", { ...Object.fromEntries(params), page: String(to) }), text }));
    return [
      el("h2", { text: "Pipelines" }),
      form,
      el("p", { id: "pipelines-count", text: page.total === 0 ? "No pipeline matches." : `${first}–${last} of ${page.total}, newest first` }),
      table(["id", "name", "state", "dataset", "owner", "blocks", "submitted", "ended", "result"],
        page.rows.map((p) => [pipelineLink(p), p.name, p.state, p.dataset, p.owner, blockLinks(p.dataset, p.block_keys),
          when(p.submitted_at), when(p.finished_at), p.result]), (i) => "pipeline " + page.rows[i].state, "pipelines-table"),
      el("p", { class: "pager" }, move(page.page - 1, "← newer", "page-newer"), ` page ${page.page} of ${page.pages} `,
        move(page.page + 1, "older →", "page-older")),
    ];
  });
}

// -- queue ----------------------------------------------------------------------------------

async function showQueue() {
  const asked = location.hash;
  const queue = await getJSON("/v1/dashboard/queue");
  render(asked, queue, () => [
    queue.condition ? el("p", { id: "condition", class: "error banner", text: `scheduler: ${queue.condition}; retrying` }) : null,
    el("h2", { text: `Pending (${queue.pending.length})` }),
    table(["id", "name", "dataset", "owner", "submitted", "blocks", "reason"],
      queue.pending.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, when(p.submitted_at), blockLinks(p.dataset, p.block_keys), p.reason || ""])),
    el("h2", { text: `Granted, waiting for compute (${queue.granted.length})` }),
    table(["id", "name", "dataset", "owner", "granted", "reason"],
      queue.granted.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, when(p.granted_at), p.reason || ""])),
    el("h2", { text: `Running (${queue.running.length})` }),
    table(["id", "name", "dataset", "owner", "started", "placement"],
      queue.running.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, when(p.started_at), p.placement])),
    el("h2", { text: "Recently ended" }),
    table(["id", "name", "dataset", "owner", "state", "ended", "message"],
      queue.recent.map((p) => [pipelineLink(p), p.name, p.dataset, p.owner, p.state, when(p.finished_at), p.message || ""])),
    el("p", {}, el("a", { href: "#pipelines", text: "Every pipeline, with filters and search →" })),
  ]);
}

// -- one pipeline ---------------------------------------------------------------------------

let cancelResult = "";

async function cancel(id) {
  try {
    const answer = await getJSON(`/v1/pipelines/${encodeURIComponent(id)}/cancel`, "POST");
    cancelResult = "cancel: " + (answer.outcome || answer.state || "done");
  } catch (error) {
    cancelResult = "cancel refused: " + (error.status ? `${error.status}: ` : "") + error.message;
  }
  refresh();
}

async function download(id, name, status) {
  try {
    const path = name.split("/").map(encodeURIComponent).join("/");
    const blob = await (await fetchWithToken(`/v1/pipelines/${encodeURIComponent(id)}/artifacts/${path}`)).blob();
    const link = el("a", { href: URL.createObjectURL(blob), download: name.split("/").pop() });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    status.textContent = `downloaded ${name} (${blob.size} bytes)`;
  } catch (error) {
    status.textContent = "download refused: " + error.message;
  }
}

function summary(p) {
  const stages = { pending: "waits for budget", granted: "holds its budget and waits for compute", running: "runs",
    completed: "completed", failed: "failed", timed_out: "timed out waiting for a grant", cancelled: "was cancelled" };
  const at = p.finished_at || p.started_at || p.granted_at || p.submitted_at;
  return `${p.name} ${stages[p.state] || p.state} (since ${when(at)}), on ${p.dataset}, submitted by ${p.owner}.`;
}

function resultParts(p) {
  if (!p.outputs) {
    return [el("p", { id: "result", class: "withheld", text: "What this code job released is shown to its submitter and admins only." })];
  }
  if (p.result === null) { return [el("p", { id: "result", text: "Its result appears here once it has ended." })]; }
  const r = p.result;
  const status = el("span", { id: "download-status" });
  const parts = [
    el("p", { id: "result", text: r.epsilon === null ? "Nothing was charged." : `Charged ε = ${num(r.epsilon)} at δ_G = ${num(p.delta)} (its largest block).` +
      (r.first_access ? ` It first read its data at ${when(r.first_access)}.` : " It never read its data.") }),
    el("h4", { text: "Released metrics" }),
    r.metrics.length ? table(["metric", "value"], r.metrics, null, "metrics") : el("p", { id: "metrics", text: "(none)" }),
  ];
  if (r.releases.length) {
    parts.push(el("h4", { text: "Privacy primitives' releases" }));
    parts.push(table(["query", "ε", "δ", "value"], r.releases.map((x) => [x.query ?? x.name ?? "", num(x.epsilon), num(x.delta, 3),
      typeof x.value === "object" ? JSON.stringify(x.value) : String(x.value)])));
  }
  parts.push(el("h4", { text: "Artifacts" }));
  if (r.artifacts.length === 0) {
    parts.push(el("p", { text: "(none)" }));
  } else {
    parts.push(table(["file", "size", ""], r.artifacts.map((a) => {
      const button = el("button", { class: "download", "data-name": a.name, text: "Download" });
      button.addEventListener("click", () => download(p.id, a.name, status));
      return [a.name, `${a.size} bytes`, button];
    }), null, "artifacts"));
    parts.push(status);
  }
  return parts;
}

async function showPipeline(id) {
  const asked = location.hash;
  const p = await getJSON("/v1/dashboard/pipelines/" + encodeURIComponent(id));
  const ended = ["completed", "failed", "timed_out", "cancelled"].includes(p.state);
  render(asked, { p, cancelResult }, () => {
    const cancelButton = el("button", { id: "cancel", text: "Cancel" });
    cancelButton.addEventListener("click", () => cancel(p.id));
    return [
      el("h2", { text: `Pipeline ${p.id}: ${p.name}` }),
      el("p", { id: "summary" }, el("span", { id: "pipeline-state", class: "state " + p.state, text: p.state }), " — " + summary(p)),
      ended ? null : cancelButton,
      el("p", { id: "cancel-result", class: "error", text: cancelResult }),
      p.waiting ? el("p", { id: "waiting", text: `Why it waits: ${p.waiting}` }) : null,
      p.message ? el("p", { id: "reason", text: `Reason: ${p.message}` }) : null,
      el("h3", { text: "Timeline" }),
      table(["step", "at"], [["submitted", when(p.submitted_at)], ["granted", when(p.granted_at)], ["started", when(p.started_at)],
        ["ended", when(p.finished_at)]].filter(([, at]) => at), null, "timeline"),
      p.placement ? el("p", { id: "placement", text: `Placement: ${p.placement}` }) : null,
      el("h3", { text: "Budget per block" }),
      el("p", { class: "note", text: `Shares of each block's capacity (basic: its binding dimension; RDP: its best order); ε at δ_G = ${num(p.delta)}.` }),
      table(["block", "demand", "block left", "consumed"],
        p.demands.map((d) => [blockLinks(p.dataset, [d.block]), `ε = ${num(d.demand.epsilon)} → ${pct(d.demand_percent)} of block ${d.block}`,
          pct(d.left_percent), d.consumed ? `ε = ${num(d.consumed.epsilon)} → ${pct(d.consumed_percent)}` : ""]), null, "demands"),
      p.accounting === "rdp" && p.demands.length ? el("details", { id: "rdp-detail" }, el("summary", { text: "RDP detail: demand and budget left at each live order" }),
        ...p.demands.map((d) => el("div", {}, el("h4", { text: d.block }),
          table(["order", "demand", "left"], d.detail.map((row) => [row.dimension, num(row.demand), num(row.left)]))))) : null,
      el("h3", { text: "What it runs" }),
      table(["field", "value"], p.job, null, "job"),
      el("h3", { text: "Result" }),
      ...resultParts(p),
      el("h3", { text: "Log (end)" }),
      el("pre", { id: "log", text: p.log_tail === null ? "(this job's log is not shown to you: a code job's goes to its submitter and admins, a built-in job's to admins)" : p.log_tail || "(empty)" }),
    ];
  });
}

// -- teams and audit ------------------------------------------------------------------------

async function showTeams() {
  const asked = location.hash;
  const datasets = await getJSON("/v1/dashboard/teams");
  render(asked, datasets, () => {
    const parts = [el("h2", { text: "Teams and quotas" }),
      el("p", { class: "note", text: "A quota caps the share of every block's capacity a team may hold (allocated + consumed). Held and consumed: on the team's most-held block. Pipelines submitted without a team (locally) count under none." })];
    for (const dataset of datasets) {
      parts.push(el("h3", { text: dataset.name }));
      parts.push(dataset.teams.length === 0 ? el("p", { text: "No team has a quota or a pipeline here." })
        : table(["team", "quota", "held", "consumed", "pipelines"],
          dataset.teams.map((t) => [t.team, t.quota_percent === null ? "no cap" : pct(t.quota_percent), pct(t.held_percent),
            pct(t.consumed_percent), el("a", { href: hashFor("pipelines", { dataset: dataset.name }), text: String(t.pipelines) })]),
          null, "teams-" + dataset.name));
    }
    return parts;
  });
}

async function showAudit() {
  const asked = location.hash;
  const audit = await getJSON("/v1/dashboard/audit");
  render(asked, audit, () => [
    el("h2", { text: "Audit" }),
    el("p", { id: "audit-result", class: audit.ok ? "ok" : "error",
      text: audit.ok ? `ok: ${audit.blocks} blocks, ${audit.events} events, every invariant holds`
                     : `${audit.violations.length} violation(s)` }),
    el("ul", {}, ...audit.violations.map((v) => el("li", { text: v }))),
    el("p", { text: "Event chain head (keep it elsewhere; privsched audit --expect HEAD checks it later):" }),
    el("pre", { id: "chain-head", text: audit.head }),
  ]);
}

// A refused page replaces the view: what was asked, and why not.
function refusedPage(asked, error) {
  const titles = { 403: "Not allowed", 404: "Not found" };
  render(asked, { refused: error.status, message: error.message }, () => [
    el("section", { id: "refused", class: "refused", "data-status": String(error.status) },
      el("h2", { text: `${titles[error.status] || "Refused"} (${error.status})` }),
      el("p", { id: "refused-message", text: error.message }),
      el("p", {}, el("a", { href: "#blocks", text: "Back to the blocks" }))),
  ]);
}

function route() {
  const { page, argument, params } = location_();
  if (page !== "pipeline") { cancelResult = ""; }
  for (const name of PAGES) {
    document.getElementById("nav-" + name).classList.toggle("current", name === page);
  }
  if (page === "pipelines") { return showPipelines(params); }
  if (page === "queue") { return showQueue(); }
  if (page === "teams") { return showTeams(); }
  if (page === "audit") { return showAudit(); }
  if (page === "pipeline") { return showPipeline(argument); }
  return showBlocks(params);
}

async function refresh() {
  const asked = location.hash;
  try {
    await route();
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    if (error instanceof Refused) { refusedPage(asked, error); return; }
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
