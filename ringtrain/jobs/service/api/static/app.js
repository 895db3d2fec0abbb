// The ringtrain dashboard: clusters, jobs, live logs and training curves, from the job service's
// API. Everything a job wrote is put in the page as text (textContent / text nodes), never as
// markup; the server's Content-Security-Policy forbids inline script besides.
"use strict";

const WRITE = { "X-Ringtrain-Request": "1" }; // the guard wants it on cookie-authenticated changes
const TERMINAL = new Set(["succeeded", "failed", "terminated"]);
const COLORS = ["#2f6fed", "#e8590c", "#12805c", "#9c36b5", "#c92a2a", "#0b7285", "#5c940d", "#862e9c"];
const LOG_TAIL_BYTES = 512 * 1024; // a rank's log is shown from at most this far before its end
const LOG_KEEP_NODES = 4000; // lines kept in a log pane; older ones are dropped
const PHASES = ["data_ms", "h2d_ms", "forward_backward_ms", "communication_ms", "optimizer_ms", "other_ms"];
const SPLIT_STEPS = 50;

const state = { jobs: new Map(), clusters: [], host: null, connected: false, progress: {}, diskBanner: "" };
let view = { name: "", cleanup: () => {}, onChange: () => {} };

// -- helpers --------------------------------------------------------------------------------------

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null) continue;
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v; // CSSOM: the CSP refuses style attributes
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return e;
}

async function api(path, opts) {
  const r = await fetch(path, Object.assign({ headers: WRITE, cache: "no-store" }, opts || {}));
  if (!r.ok) {
    let detail = `${r.status} ${r.statusText}`;
    try { detail = (await r.json()).detail || detail; } catch (e) { /* not JSON */ }
    if (r.status === 401) signedOut(detail);
    throw new Error(detail);
  }
  return r.status === 204 ? null : r.json();
}

// A token revoked or expired says so; any other 401 means the browser never signed in.
function signedOut(detail) {
  showBanner(/revoked|expired/.test(detail || "") ? `Signed out: ${detail}`
    : "Not signed in: open the URL that `ringtrain dashboard` prints.");
}

function showBanner(text) {
  const b = document.getElementById("banner");
  b.textContent = text;
  b.hidden = !text;
}

function badge(s) { return el("span", { class: `badge ${s}`, text: s }); }

function ago(t) {
  if (!t) return "";
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return new Date(t * 1000).toLocaleDateString();
}

function duration(j) {
  const start = j.running_at || j.started_at;
  if (!start) return "";
  const end = j.ended_at || Date.now() / 1000;
  return hms(end - start);
}

function hms(seconds) {
  let s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  return h ? `${h}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

// Disk space in MB (10^6 bytes), as the service's messages and `--min-free-mb` count it.
function megabytes(n) {
  const mb = n / 1e6;
  return `${mb < 10 ? mb.toFixed(1) : Math.round(mb).toLocaleString("en")} MB`;
}

function bar(percent) {
  const p = Math.max(0, Math.min(100, percent || 0));
  const b = el("span", { class: "bar" }, el("span"));
  b.firstChild.style.width = `${p}%`;
  return b;
}

let renderQueued = false;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => { renderQueued = false; view.onChange(); });
}

// -- live state: the event stream -----------------------------------------------------------------

function setLive(on) {
  state.connected = on;
  const l = document.getElementById("live");
  l.className = `live ${on ? "on" : "off"}`;
  l.textContent = on ? "live" : "reconnecting";
}

function connect() {
  const es = new EventSource("/v1/events");
  es.onopen = () => { setLive(true); showBanner(""); };
  es.addEventListener("snapshot", e => {
    const d = JSON.parse(e.data);
    state.jobs = new Map(d.jobs.map(j => [j.id, j]));
    state.clusters = d.clusters;
    state.host = d.host;
    renderHost();
    scheduleRender();
  });
  es.addEventListener("changes", e => {
    const d = JSON.parse(e.data);
    for (const j of d.jobs) state.jobs.set(j.id, j);
    for (const id of d.removed) state.jobs.delete(id);
    state.clusters = d.clusters;
    scheduleRender();
  });
  es.addEventListener("host", e => { state.host = JSON.parse(e.data); renderHost(); if (view.name !== "jobs") scheduleRender(); });
  es.onerror = () => {
    setLive(false);
    if (es.readyState === EventSource.CLOSED) {
      // The stream was refused (a restarted server, a lost cookie): find out why, then retry.
      fetch("/v1/health").then(async r => {
        if (r.status === 401) signedOut((await r.json().catch(() => ({}))).detail);
      }).catch(() => showBanner("The job service does not answer; retrying."));
      setTimeout(connect, 3000);
    }
  };
}

function renderHost() {
  const h = state.host, span = document.getElementById("host-usage");
  if (!h) return;
  let text = `${h.host} · CPU ${h.cpu_percent.toFixed(0)}% of ${h.cpus} · mem ${bytes(h.memory_used)} / ${bytes(h.memory_total)}`;
  for (const g of h.gpus || []) text += ` · GPU${g.index} ${g.util_percent.toFixed(0)}%`;
  const d = h.disk;
  if (d) text += ` · disk ${megabytes(d.free_bytes)} free`;
  span.textContent = text;
  // Below its floor the service refuses new jobs (507): say so before a submit finds out.
  const said = d && d.below_floor ? `The disk holding ${d.path} has ${megabytes(d.free_bytes)} free, under the service's floor of ${megabytes(d.floor_bytes)}: new jobs are refused until space is freed there.` : "";
  // Another notice (a revoked token, a lost connection) is left as it is.
  if (said) showBanner(said);
  else if (state.diskBanner && document.getElementById("banner").textContent === state.diskBanner) showBanner("");
  state.diskBanner = said;
}

// -- routing ------------------------------------------------------------------------------------

function route() {
  view.cleanup();
  const root = document.getElementById("view");
  root.textContent = "";
  const parts = (location.hash || "#/jobs").slice(2).split("/").map(decodeURIComponent);
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", a.dataset.nav === (parts[0] === "compare" ? "jobs" : parts[0]));
  }
  if (parts[0] === "jobs" && parts[1]) view = jobView(root, parts[1]);
  else if (parts[0] === "compare" && parts[1]) view = compareView(root, parts[1].split(",").filter(Boolean));
  else if (parts[0] === "clusters") view = clustersView(root);
  else if (parts[0] === "deployments") view = deploymentsView(root);
  else view = jobsView(root);
  view.onChange();
}

// -- jobs table ----------------------------------------------------------------------------------

const COLUMNS = [
  ["id", "Job", j => j.id], ["state", "State", j => j.state], ["cluster", "Cluster", j => j.cluster],
  ["shape", "Nodes × procs", j => j.node_count * 1000 + j.process_count_per_node],
  ["created_at", "Submitted", j => j.created_at],
  ["duration", "Duration", j => (j.ended_at || Date.now() / 1000) - (j.running_at || j.started_at || Infinity)],
  ["progress", "Progress", j => { const p = state.progress[j.id]; return p ? (p.total_steps ? p.step / p.total_steps : 0) : -1; }],
  ["exit_code", "Exit", j => j.exit_code === null ? -1e9 : j.exit_code],
  ["experiment", "Experiment", j => j.experiment || ""], ["message", "Message", j => j.message],
];
const jobsUi = { filter: "", state: "", cluster: "", sort: "created_at", asc: false, page: 0,
                 selected: new Set(), showServing: false };
const PAGE_ROWS = 100; // rows of the jobs table per page: a thousand rows would cost the browser
const PROGRESS_EVERY_MS = 2000;

// A running job's progress cell: step (of the total it declared), steps/s and the ETA.
function progressCell(td, p) {
  td.textContent = "";
  if (!p) return;
  let text = `step ${p.step}${p.total_steps ? ` / ${p.total_steps}` : ""}`;
  if (p.steps_per_s) text += ` · ${p.steps_per_s < 10 ? p.steps_per_s.toFixed(2) : p.steps_per_s.toFixed(1)} steps/s`;
  if (p.eta_s !== null && p.eta_s !== undefined) text += ` · ETA ${hms(p.eta_s)}`;
  if (p.total_steps) td.appendChild(bar(100 * p.step / p.total_steps));
  td.appendChild(document.createTextNode(text));
  td.dataset.step = String(p.step);
}

function jobsView(root) {
  const search = el("input", { type: "search", placeholder: "Filter by id, name, experiment, message…", value: jobsUi.filter });
  const stateSel = el("select", {}, el("option", { value: "", text: "all states" }),
    ["staging", "queued", "preparing", "running", "uploading", "terminating", "succeeded", "failed",
     "terminated"]
      .map(s => el("option", { value: s, text: s })));
  stateSel.value = jobsUi.state;
  const clusterSel = el("select", {}, el("option", { value: "", text: "all clusters" }));
  const serving = el("input", { type: "checkbox", id: "show-serving" });
  serving.checked = jobsUi.showServing;
  const compare = el("button", { id: "compare", onclick: () => {
    location.hash = `#/compare/${[...jobsUi.selected].map(encodeURIComponent).join(",")}`;
  } });
  const count = el("span", { class: "count" });
  const head = el("tr", {}, el("th", { class: "pick", title: "pick jobs to compare their curves" }), COLUMNS.map(([key, label]) => el("th", {
    "data-key": key, text: label,
    onclick: () => { jobsUi.asc = jobsUi.sort === key ? !jobsUi.asc : key === "id"; jobsUi.sort = key; render(); },
  })));
  const body = el("tbody", { id: "jobs-body" });
  const prev = el("button", { id: "jobs-prev", text: "‹ newer", onclick: () => { jobsUi.page--; render(); } });
  const next = el("button", { id: "jobs-next", text: "older ›", onclick: () => { jobsUi.page++; render(); } });
  const pageNote = el("span", { class: "count", id: "jobs-page" });
  root.appendChild(el("h1", { text: "Jobs" }));
  root.appendChild(el("div", { class: "sub", text: "Every training job of this service, updated as it changes; tick several to compare their curves." }));
  root.appendChild(el("div", { class: "panel" },
    el("div", { class: "toolbar" }, search, stateSel, clusterSel,
      el("label", { title: "the jobs that run deployments' model servers (also on the Deployments page)" }, serving, " deployments' jobs"),
      compare, count),
    el("table", { id: "jobs-table" }, el("thead", {}, head), body),
    el("div", { class: "toolbar pager" }, prev, pageNote, next)));
  search.addEventListener("input", () => { jobsUi.filter = search.value; jobsUi.page = 0; render(); });
  stateSel.addEventListener("change", () => { jobsUi.state = stateSel.value; jobsUi.page = 0; render(); });
  clusterSel.addEventListener("change", () => { jobsUi.cluster = clusterSel.value; jobsUi.page = 0; render(); });
  serving.addEventListener("change", () => { jobsUi.showServing = serving.checked; jobsUi.page = 0; render(); });
  const durations = new Map(), progresses = new Map();
  const rowTemplate = el("tr", {}, el("td", { class: "pick" }, el("input", { type: "checkbox" })),
    el("td", { class: "mono" }, el("a")), el("td", { class: "state" }, el("span")),
    el("td"), el("td"), el("td"), el("td"), el("td", { class: "progress" }), el("td"), el("td"), el("td", { class: "msg" }));
  // Full dates and messages as tooltips, made when hovered rather than for every row.
  body.addEventListener("mouseover", e => {
    const td = e.target.closest("td");
    if (!td || td.title) return;
    if (td.dataset.t) td.title = new Date(Number(td.dataset.t) * 1000).toLocaleString();
    else if (td.classList.contains("msg")) td.title = td.textContent;
  });
  body.addEventListener("change", e => {
    const tr = e.target.closest("tr[data-job]");
    if (!tr) return;
    if (e.target.checked) jobsUi.selected.add(tr.dataset.job); else jobsUi.selected.delete(tr.dataset.job);
    pickNote();
  });
  function pickNote() {
    compare.textContent = `Compare${jobsUi.selected.size ? ` (${jobsUi.selected.size})` : ""}`;
    compare.disabled = jobsUi.selected.size < 2;
    compare.title = compare.disabled ? "tick two jobs or more" : "their curves overlaid, a chart per tag";
  }

  function render() {
    const names = [...new Set([...state.jobs.values()].map(j => j.cluster))].sort();
    if (clusterSel.options.length !== names.length + 1) {
      clusterSel.textContent = "";
      clusterSel.appendChild(el("option", { value: "", text: "all clusters" }));
      for (const n of names) clusterSel.appendChild(el("option", { value: n, text: n }));
      clusterSel.value = jobsUi.cluster;
    }
    for (const id of jobsUi.selected) if (!state.jobs.has(id)) jobsUi.selected.delete(id);
    pickNote();
    const f = jobsUi.filter.toLowerCase();
    const key = COLUMNS.find(c => c[0] === jobsUi.sort)[2];
    let serves = 0;
    // A deployment's job runs model servers, not training: out of this list unless asked for.
    const rows = [...state.jobs.values()].filter(j => {
      if (j.serves && !jobsUi.showServing) { serves++; return false; }
      return (!jobsUi.state || j.state === jobsUi.state) && (!jobsUi.cluster || j.cluster === jobsUi.cluster) &&
        (!f || [j.id, j.name, j.experiment || "", j.message, j.cluster].some(s => s.toLowerCase().includes(f)));
    });
    rows.sort((a, b) => { const x = key(a), y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * (jobsUi.asc ? 1 : -1); });
    for (const th of head.children) {
      th.classList.toggle("sorted", th.dataset.key === jobsUi.sort);
      th.classList.toggle("asc", jobsUi.asc);
    }
    count.textContent = `${rows.length} of ${state.jobs.size} jobs${serves ? ` · ${serves} deployment job(s) hidden` : ""}`;
    const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
    jobsUi.page = Math.min(Math.max(0, jobsUi.page), pages - 1);
    const first = jobsUi.page * PAGE_ROWS, shown = rows.slice(first, first + PAGE_ROWS);
    pageNote.textContent = rows.length ? `${first + 1}–${first + shown.length} of ${rows.length}` : "";
    prev.disabled = jobsUi.page === 0;
    next.disabled = jobsUi.page >= pages - 1;
    prev.parentNode.hidden = pages === 1;
    body.textContent = "";
    durations.clear();
    progresses.clear();
    const frag = document.createDocumentFragment();
    for (const j of shown) {
      // One cloned template per row, cells filled as text: ~10x cheaper than building each.
      const tr = rowTemplate.cloneNode(true), c = tr.children;
      tr.dataset.job = j.id;
      c[0].firstChild.checked = jobsUi.selected.has(j.id);
      c[1].firstChild.href = `#/jobs/${encodeURIComponent(j.id)}`;
      c[1].firstChild.textContent = j.id;
      c[2].firstChild.className = `badge ${j.state}`;
      c[2].firstChild.textContent = j.state;
      c[3].textContent = j.cluster;
      c[4].textContent = `${j.node_count} × ${j.process_count_per_node}`;
      c[5].textContent = ago(j.created_at);
      c[5].dataset.t = j.created_at;
      c[6].textContent = duration(j);
      if (!TERMINAL.has(j.state)) durations.set(j.id, c[6]);
      if (j.state === "running") { progresses.set(j.id, c[7]); progressCell(c[7], state.progress[j.id]); }
      c[8].textContent = j.exit_code === null ? "" : String(j.exit_code);
      c[9].textContent = j.experiment || "";
      c[10].textContent = j.message;
      frag.appendChild(tr);
    }
    if (!rows.length) frag.appendChild(el("tr", {}, el("td", { colspan: COLUMNS.length + 1, class: "empty", text: state.jobs.size ? "No job matches." : "No jobs yet: `ringtrain job submit spec.yaml --cluster NAME`." })));
    body.appendChild(frag);
  }
  const tick = setInterval(() => {
    for (const [id, td] of durations) { const j = state.jobs.get(id); if (j) td.textContent = duration(j); }
  }, 1000);
  // Progress of the running jobs only (the server reads each job's files only as they grow).
  let asking = false;
  async function askProgress() {
    if (asking || ![...state.jobs.values()].some(j => j.state === "running")) return;
    asking = true;
    try { state.progress = await api("/v1/progress"); } catch (e) { return; } finally { asking = false; }
    for (const [id, td] of progresses) progressCell(td, state.progress[id]);
  }
  askProgress();
  const progressTick = setInterval(askProgress, PROGRESS_EVERY_MS);
  return { name: "jobs", onChange: render, cleanup: () => { clearInterval(tick); clearInterval(progressTick); } };
}

// -- one job --------------------------------------------------------------------------------------

function jobView(root, id) {
  const timers = [], aborts = [];
  let job = null, tab = "charts", filesCache = null;
  const title = el("h1", {}, el("span", { class: "mono", text: id }), " ", el("span", { id: "job-state" }));
  const sub = el("div", { class: "sub" });
  const terminateBtn = el("button", { class: "danger", id: "terminate", text: "Terminate", onclick: terminate });
  const deleteBtn = el("button", { id: "delete", text: "Delete", onclick: remove });
  const cause = el("div", { class: "cause", id: "cause", hidden: "" });
  const tabs = el("div", { class: "tabs" });
  const pane = el("div", { id: "pane" });
  root.append(el("div", { class: "toolbar" }, el("a", { href: "#/jobs", text: "← Jobs" })),
    el("div", { class: "toolbar" }, el("div", { style: "flex:1" }, title, sub), terminateBtn, deleteBtn),
    cause, el("div", { class: "panel" }, tabs, pane));
  for (const [key, label] of [["charts", "Training curves"], ["logs", "Logs"], ["ranks", "Processes"], ["files", "Files"], ["details", "Spec & attempts"]]) {
    tabs.appendChild(el("button", { "data-tab": key, text: label, onclick: () => { tab = key; showTab(); } }));
  }
  const charts = chartsPane(id, () => state.jobs.get(id));
  const logs = logsPane(id, () => job);
  const ranks = ranksPane(id, () => state.jobs.get(id));

  async function terminate() {
    if (!confirm(`Terminate job ${id}? Its processes are stopped.`)) return;
    try { await api(`/v1/jobs/${encodeURIComponent(id)}/terminate`, { method: "POST" }); }
    catch (e) { alert(`Could not terminate: ${e.message}`); }
  }
  async function remove() {
    if (!confirm(`Delete job ${id} and its folder (logs, outputs)? This cannot be undone.`)) return;
    try { await api(`/v1/jobs/${encodeURIComponent(id)}`, { method: "DELETE" }); location.hash = "#/jobs"; }
    catch (e) { alert(`Could not delete: ${e.message}`); }
  }
  function showTab() {
    for (const b of tabs.children) b.classList.toggle("active", b.dataset.tab === tab);
    charts.hide(); logs.stop(); ranks.stop();
    pane.textContent = "";
    if (tab === "charts") charts.show(pane);
    else if (tab === "logs") logs.show(pane);
    else if (tab === "ranks") ranks.show(pane);
    else if (tab === "files") filesPane(pane, id, f => { filesCache = f; });
    else detailsPane(pane, job, filesCache);
  }
  function header() {
    const s = state.jobs.get(id);
    if (!s) {
      if (state.jobs.size || state.connected) sub.textContent = "This job does not exist (deleted?).";
      return;
    }
    const st = document.getElementById("job-state");
    st.textContent = "";
    st.appendChild(badge(s.state));
    sub.textContent = `${s.name} · cluster ${s.cluster} · ${s.node_count} node(s) × ${s.process_count_per_node} process(es)` +
      `${s.attempt ? ` · attempt ${s.attempt + 1}` : ""} · submitted ${ago(s.created_at)}${s.ended_at ? ` · ran ${duration(s)}` : ""}` +
      `${s.exit_code !== null ? ` · exit ${s.exit_code}` : ""}`;
    const u = state.host && state.host.jobs ? state.host.jobs[id] : null;
    if (u && !TERMINAL.has(s.state)) {
      sub.textContent += ` · CPU ${u.cpu_percent === null ? "…" : u.cpu_percent.toFixed(0) + "%"} · memory ${bytes(u.memory)} in ${u.processes} processes`;
    }
    terminateBtn.disabled = TERMINAL.has(s.state) || s.state === "terminating";
    deleteBtn.disabled = !TERMINAL.has(s.state);
    const failed = s.state === "failed" || (s.state === "terminated" && s.message);
    cause.hidden = !(s.message && (failed || !TERMINAL.has(s.state)));
    cause.textContent = "";
    cause.appendChild(el("b", { text: s.state === "failed" ? "Why it failed" : "Status" }));
    cause.appendChild(document.createTextNode(s.message));
    if (job && job.state !== s.state) refreshJob();
  }
  async function refreshJob() {
    try { job = await api(`/v1/jobs/${encodeURIComponent(id)}`); } catch (e) { return; }
    if (tab === "details") showTab();
  }
  refreshJob().then(header);
  showTab();
  return {
    name: "job",
    onChange: () => { header(); charts.poke(); },
    cleanup: () => { charts.hide(); logs.stop(); ranks.stop(); timers.forEach(clearInterval); aborts.forEach(a => a.abort()); },
  };
}

// -- training curves: settings, controls and a set of charts by tag ------------------------------

// What TensorBoard users set once and expect to find again: smoothing (TensorBoard's default
// 0.6), a log-scale y axis and the x axis, kept in this browser across page loads.
const PREFS_KEY = "ringtrain.dashboard.charts";
const chartPrefs = readChartPrefs();

function readChartPrefs() {
  const p = { smoothing: 0.6, logY: false, xMode: "step" };
  try {
    const saved = JSON.parse(localStorage.getItem(PREFS_KEY) || "{}") || {};
    const w = Number(saved.smoothing);
    if (saved.smoothing !== undefined && w >= 0 && w <= 0.99) p.smoothing = w;
    if (typeof saved.logY === "boolean") p.logY = saved.logY;
    if (saved.xMode === "step" || saved.xMode === "time") p.xMode = saved.xMode;
  } catch (e) { /* storage off or the value mangled: the defaults */ }
  return p;
}

function saveChartPrefs() {
  try { localStorage.setItem(PREFS_KEY, JSON.stringify(chartPrefs)); } catch (e) { /* storage off */ }
}

// The x-axis choice, the smoothing slider and the log-scale box; `changed(xChanged)` redraws.
function chartControls(changed) {
  const xSel = el("select", { id: "x-axis" }, el("option", { value: "step", text: "x: step" }), el("option", { value: "time", text: "x: time" }));
  xSel.value = chartPrefs.xMode;
  const slider = el("input", { type: "range", id: "smoothing", min: "0", max: "0.99", step: "0.01", value: String(chartPrefs.smoothing) });
  const shown = el("span", { class: "count mono", id: "smoothing-value", text: chartPrefs.smoothing.toFixed(2) });
  const log = el("input", { type: "checkbox", id: "log-y" });
  log.checked = chartPrefs.logY;
  xSel.addEventListener("change", () => { chartPrefs.xMode = xSel.value; saveChartPrefs(); changed(true); });
  slider.addEventListener("input", () => {
    chartPrefs.smoothing = Math.min(0.99, Math.max(0, Number(slider.value)));
    shown.textContent = chartPrefs.smoothing.toFixed(2);
    saveChartPrefs();
    changed(false);
  });
  log.addEventListener("change", () => { chartPrefs.logY = log.checked; saveChartPrefs(); changed(false); });
  return [xSel, el("label", { title: "TensorBoard's smoothing: an exponential moving average, debiased; the raw line stays faint behind" }, "smoothing ", slider, " ", shown),
    el("label", { title: "values ≤ 0 are left out on a log scale" }, log, " log scale")];
}

// One LineChart per tag in `container`, kept across updates (a redraw keeps its place).
// Series are {run, tag, xs, ys, walls, label?}; the job's own tags come first, then the step
// profiler's phases (runs "rank N").
function chartSet(container) {
  const charts = new Map();
  return {
    size: () => charts.size,
    clear() { charts.clear(); },
    update(series, name) {
      const byTag = new Map();
      for (const s of series) { if (!byTag.has(s.tag)) byTag.set(s.tag, []); byTag.get(s.tag).push(s); }
      const profiler = list => list.every(s => /^rank \d+$/.test(s.run));
      const ordered = [...byTag.entries()].sort((a, b) =>
        (profiler(a[1]) - profiler(b[1])) || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
      const time = chartPrefs.xMode === "time";
      for (const [tag, list] of ordered) {
        let c = charts.get(tag);
        if (!c) { c = new LineChart(container, tag); c.root.dataset.tag = tag; charts.set(tag, c); }
        c.set(list.map((s, k) => ({ name: name(s, list, tag), color: COLORS[k % COLORS.length],
          xs: time ? s.walls : s.xs, ys: s.ys })), time, { smoothing: chartPrefs.smoothing, logY: chartPrefs.logY });
        c.root.dataset.points = String(c.points());
        container.appendChild(c.root); // keeps the order above as tags appear
      }
    },
  };
}

// New points of a job's scalars into `series` (one entry per series the API names).
function takeScalars(series, d, extra) {
  while (series.length < d.series.length) {
    const m = d.series[series.length];
    series.push(Object.assign({ run: m.run, tag: m.tag, xs: [], ys: [], walls: [] }, extra || {}));
  }
  for (const [i, step, wall, value] of d.points) {
    const s = series[i];
    s.xs.push(step); s.walls.push(wall); s.ys.push(value);
  }
}

function chartsPane(id, summary) {
  const series = []; // {run, tag, xs, ys, walls}
  let cursor = 0, timer = null, container = null, charts = null, busy = false, finalRead = false;

  async function poll() {
    if (busy) return;
    busy = true;
    try {
      const s = summary();
      const ended = s && TERMINAL.has(s.state);
      const d = await api(`/v1/jobs/${encodeURIComponent(id)}/scalars?cursor=${cursor}`);
      takeScalars(series, d);
      cursor = d.cursor;
      if (d.points.length || !charts || !charts.size()) draw(d.truncated);
      if (ended) { finalRead = true; stopTimer(); }
    } catch (e) { /* shown by the banner if it is the token; retried next tick otherwise */ }
    finally { busy = false; }
  }
  function stopTimer() { if (timer) { clearInterval(timer); timer = null; } }
  function draw(truncated) {
    if (!container) return;
    if (!series.length) {
      container.textContent = "";
      container.appendChild(el("div", { class: "empty", text: "No scalars yet. Log them with torch.utils.tensorboard.SummaryWriter under an output folder (e.g. outputs/<name>/tb), or turn on the step profiler." }));
      charts.clear();
      return;
    }
    if (!charts.size()) container.textContent = "";
    drawSplit();
    // One line per run: per rank when each rank writes its own folder (outputs/tb/rankN).
    charts.update(series, (s, list, tag) => list.length > 1 || s.run !== "outputs" ? s.run : tag);
    if (truncated && !container.querySelector(".trunc")) {
      container.appendChild(el("div", { class: "empty trunc", text: "Too many points: later ones are not shown." }));
    }
  }
  // The step profiler's phases: per rank, the mean of its last SPLIT_STEPS steps, stacked.
  function drawSplit() {
    const ranks = new Map();
    for (const s of series) {
      if (!PHASES.includes(s.tag) || !s.ys.length) continue;
      if (!ranks.has(s.run)) ranks.set(s.run, {});
      const tail = s.ys.slice(-SPLIT_STEPS);
      ranks.get(s.run)[s.tag] = tail.reduce((a, b) => a + b, 0) / tail.length;
    }
    let box = container.querySelector("#split");
    if (!ranks.size) { if (box) box.remove(); return; }
    if (!box) { box = el("div", { class: "chart split-box", id: "split" }); container.prepend(box); }
    box.textContent = "";
    box.appendChild(el("h3", { text: `Step time by phase (step profiler, mean of the last ${SPLIT_STEPS} steps)` }));
    const widest = Math.max(...[...ranks.values()].map(p => PHASES.reduce((a, k) => a + (p[k] || 0), 0))) || 1;
    for (const [run, p] of [...ranks.entries()].sort()) {
      const total = PHASES.reduce((a, k) => a + (p[k] || 0), 0);
      const bar = el("div", { class: "split" });
      bar.style.width = `${Math.max(2, 100 * total / widest)}%`;
      PHASES.forEach((k, i) => {
        if (!p[k]) return;
        const seg = el("span", { title: `${k.replace("_ms", "")}: ${p[k].toFixed(1)} ms` });
        seg.style.width = `${100 * p[k] / total}%`;
        seg.style.background = COLORS[i % COLORS.length];
        bar.appendChild(seg);
      });
      box.append(el("div", { class: "count", text: `${run} · ${total.toFixed(1)} ms per step` }), bar);
    }
    box.appendChild(el("div", { class: "legend" }, PHASES.map((k, i) => {
      const sw = el("i");
      sw.style.background = COLORS[i % COLORS.length];
      return el("span", {}, sw, k.replace("_ms", ""));
    })));
  }

  return {
    show(pane) {
      container = el("div", { class: "charts", id: "charts" });
      charts = chartSet(container);
      const redraw = xChanged => { if (xChanged) { charts.clear(); container.textContent = ""; } draw(); };
      pane.append(el("div", { class: "toolbar" }, chartControls(redraw), el("span", { class: "count", text: "TensorBoard scalars under the job's outputs (a line per run: outputs/tb/rankN per rank), and the step profiler's phases per rank; refreshed every second while the job runs." })), container);
      draw();
      poll();
      if (!finalRead) timer = setInterval(poll, 1000);
    },
    hide() { stopTimer(); container = null; if (charts) charts.clear(); },
    poke() { const s = summary(); if (container && s && TERMINAL.has(s.state) && !finalRead) poll(); },
  };
}

// -- a job's processes ------------------------------------------------------------------------------

// Each rank's CPU and memory while the job runs (a local cluster's job: read from /proc on the
// service host), and a stack dump of a rank on demand (py-spy), as Ray's dashboard has per worker.
function ranksPane(id, summary) {
  let timer = null;
  const jid = encodeURIComponent(id);
  return {
    stop() { if (timer) { clearInterval(timer); timer = null; } },
    show(pane) {
      const body = el("tbody", { id: "ranks-body" });
      const note = el("div", { class: "count", id: "ranks-note" });
      const out = el("pre", { class: "log", id: "stack", text: "Press “Stack dump” to see where a rank's Python threads are now." });
      pane.append(el("table", { id: "ranks" }, el("thead", {}, el("tr", {}, ["Rank", "PID", "CPU", "Memory", "Processes", ""].map(t => el("th", { text: t })))), body),
        note, el("h2", { style: "margin-top:14px", text: "Stack dump" }), out);
      body.addEventListener("click", async e => {
        const btn = e.target.closest("button[data-stack]");
        if (!btn) return;
        const rank = btn.dataset.stack;
        btn.disabled = true;
        out.textContent = `Dumping rank ${rank}…`;
        try {
          const d = await api(`/v1/jobs/${jid}/ranks/${rank}/stack`, { method: "POST" });
          out.textContent = `rank ${d.rank} · pid ${d.pid}\n\n${d.text}`;
        } catch (err) { out.textContent = `No stack dump of rank ${rank}: ${err.message}`; }
        finally { btn.disabled = false; }
      });
      const load = async () => {
        let d;
        try { d = await api(`/v1/jobs/${jid}/ranks`); } catch (e) { note.textContent = e.message; return; }
        body.textContent = "";
        for (const r of d.ranks) {
          body.appendChild(el("tr", { "data-rank": String(r.rank) }, el("td", { text: String(r.rank) }),
            el("td", { class: "mono", text: r.pid === null ? "—" : String(r.pid) }),
            el("td", {}, r.cpu_percent === null ? "…" : [bar(Math.min(100, r.cpu_percent)), `${r.cpu_percent.toFixed(0)}%`]),
            el("td", { text: bytes(r.memory) }), el("td", { text: String(r.processes) }),
            el("td", {}, el("button", { "data-stack": String(r.rank), text: "Stack dump", disabled: r.pid === null ? "" : null }))));
        }
        note.textContent = d.reason ? `No ranks to show: ${d.reason}.` : "CPU: percent of one core (200% = two busy cores), every 2 s; memory: resident, the rank's processes together.";
        const s = summary();
        if (s && TERMINAL.has(s.state)) this.stop();
      };
      load();
      timer = setInterval(load, 2000);
    },
  };
}

// -- compare runs ---------------------------------------------------------------------------------

// Several jobs' scalars overlaid, as TensorBoard overlays runs: a chart per tag, a line per job
// and run (so per rank where each rank writes its own folder), the legend naming the job.
function compareView(root, ids) {
  const series = new Map(ids.map(id => [id, []]));
  const cursors = new Map(ids.map(id => [id, 0]));
  const done = new Set(); // read once more after they ended, or gone: not asked again
  const problems = new Map();
  const container = el("div", { class: "charts", id: "compare-charts" });
  const charts = chartSet(container);
  const jobs = el("div", { class: "toolbar", id: "compare-jobs" });
  const redraw = xChanged => { if (xChanged) { charts.clear(); container.textContent = ""; } draw(); };
  root.append(el("div", { class: "toolbar" }, el("a", { href: "#/jobs", text: "← Jobs" })),
    el("h1", { text: `Compare ${ids.length} jobs` }),
    el("div", { class: "sub", text: "Their scalars overlaid: a chart per tag, a line per job and run (per rank when each rank writes outputs/…/rankN); refreshed every 2 s while one runs." }),
    el("div", { class: "panel" }, jobs, el("div", { class: "toolbar" }, chartControls(redraw)), container));

  function renderJobs() {
    jobs.textContent = "";
    for (const id of ids) {
      const j = state.jobs.get(id);
      jobs.appendChild(el("span", { class: "chip", "data-job": id },
        el("a", { class: "mono", href: `#/jobs/${encodeURIComponent(id)}`, text: id }), " ",
        j ? badge(j.state) : null, problems.has(id) ? el("span", { class: "count", text: ` ${problems.get(id)}` }) : null));
    }
  }
  function draw() {
    const all = ids.flatMap(id => series.get(id));
    if (!all.length) {
      container.textContent = "";
      charts.clear();
      container.appendChild(el("div", { class: "empty", text: "No scalars in these jobs yet." }));
      return;
    }
    if (!charts.size()) container.textContent = "";
    charts.update(all, s => `${s.job} · ${s.run}`);
  }
  let busy = false, timer = null;
  async function poll() {
    if (busy) return;
    busy = true;
    let grew = false;
    try {
      for (const id of ids) {
        if (done.has(id)) continue;
        const j = state.jobs.get(id);
        const ended = j && TERMINAL.has(j.state);
        try {
          const d = await api(`/v1/jobs/${encodeURIComponent(id)}/scalars?cursor=${cursors.get(id)}`);
          takeScalars(series.get(id), d, { job: id });
          cursors.set(id, d.cursor);
          grew = grew || d.points.length > 0;
          if (ended) done.add(id);
        } catch (e) { problems.set(id, e.message); done.add(id); renderJobs(); }
      }
    } finally { busy = false; }
    if (grew || !charts.size()) draw();
    if (done.size === ids.length && timer) { clearInterval(timer); timer = null; }
  }
  renderJobs();
  poll();
  timer = setInterval(poll, 2000);
  return { name: "compare", onChange: renderJobs, cleanup: () => { if (timer) clearInterval(timer); } };
}

function logsPane(id, getJob) {
  let abort = null;
  return {
    stop() { if (abort) { abort.abort(); abort = null; } },
    show(pane) {
      const s = state.jobs.get(id);
      const total = s ? s.node_count * s.process_count_per_node : 1;
      const rank = el("select", { id: "log-rank" }, Array.from({ length: total }, (_, r) => el("option", { value: String(r), text: `rank ${r}` })));
      // stdout and stderr as the rank wrote them by default: a training script's progress bar and
      // warnings go to stderr, so stdout alone can be one line for a whole run.
      const stream = el("select", { id: "log-stream" }, el("option", { value: "output", text: "stdout + stderr" }),
        el("option", { value: "stdout", text: "stdout" }), el("option", { value: "stderr", text: "stderr" }),
        Array.from({ length: s ? s.node_count : 1 }, (_, k) => el("option", { value: `prep:${k}`, text: `preparation (node ${k})` })));
      const follow = el("input", { type: "checkbox", id: "log-follow", checked: "" });
      const out = el("pre", { class: "log", id: "log" });
      const note = el("span", { class: "count" });
      pane.append(el("div", { class: "toolbar" }, rank, stream, el("label", {}, follow, " scroll with output"), note), out);
      const start = () => { this.stop(); out.textContent = ""; run(Number(rank.value), stream.value, out, follow, note); };
      rank.addEventListener("change", start);
      stream.addEventListener("change", start);
      start();
    },
  };

  async function run(rank, stream, out, follow, note) {
    const ctl = new AbortController();
    abort = ctl;
    const jid = encodeURIComponent(id);
    const append = terminalText(out, () => { if (follow.checked) out.scrollTop = out.scrollHeight; });
    try {
      if (stream.startsWith("prep:")) {
        const node = stream.slice(5);
        for (const which of ["stdout", "stderr"]) {
          const r = await fetch(`/v1/jobs/${jid}/download?path=${encodeURIComponent(`prep/node.${node}.${which}`)}`, { signal: ctl.signal });
          append(`--- node ${node} ${which} ---\n` + (r.ok ? await r.text() : "(none)\n"));
        }
        note.textContent = "";
        return;
      }
      let offset = 0;
      try {
        const page = await api(`/v1/jobs/${jid}/files?path=${encodeURIComponent(`stdouterr/rank.${rank}`)}`);
        const f = page.files.find(x => x.path.endsWith(`/${stream}`));
        if (f && f.size > LOG_TAIL_BYTES) {
          offset = f.size - LOG_TAIL_BYTES;
          append(`… ${bytes(offset)} earlier output not shown (Files tab: download the whole log) …\n`);
        }
      } catch (e) { /* no folder yet: the job has not started */ }
      note.textContent = "following";
      const r = await fetch(`/v1/jobs/${jid}/logs?rank=${rank}&stream=${stream}&follow=true&offset=${offset}`, { signal: ctl.signal });
      if (!r.ok) { append(`(${r.status}: ${(await r.json().catch(() => ({}))).detail || r.statusText})\n`); return; }
      const reader = r.body.getReader(), dec = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        append(dec.decode(value, { stream: true }));
      }
      note.textContent = "the job has ended; this is all of it";
    } catch (e) {
      if (e.name !== "AbortError") note.textContent = `stopped: ${e.message}`;
    }
  }
}

// Terminal escape sequences: CSI (colours, "\x1b[K" erasing a line), OSC up to BEL or ST (a
// hyperlink, a window title) and the short ones ("\x1b(B" of tput). A log pane shows its text
// without them: colour codes shown as raw "[31m" buried the words they coloured.
const ANSI_ESCAPE = /\x1b(?:\[[0-?]*[ -\/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[ -\/]*[0-~])/g;
// The start of an escape a chunk of the stream cut off: kept until its end arrives (an OSC
// for at most ANSI_HOLD characters, past which its text is shown).
const ANSI_CUT = /\x1b(?:\[[0-?]*[ -\/]*|\][^\x07\x1b]*\x1b?|[ -\/]+)?$/;
const ANSI_HOLD = 2048;

// Text appended to `out` as a terminal shows it: one text node per line, and a "\r" returns to
// the start of its line, whose next text replaces it (a progress bar is one updating line).
// Escape sequences are dropped (see ANSI_ESCAPE): the text stays text, never markup.
function terminalText(out, after) {
  let line = null, returned = false, held = "";
  return chunk => {
    let text = held + chunk;
    const cut = ANSI_CUT.exec(text);
    held = cut && cut[0].length <= ANSI_HOLD ? cut[0] : "";
    text = text.slice(0, text.length - held.length).replace(ANSI_ESCAPE, "");
    for (const part of text.split(/(\r|\n)/)) {
      if (part === "\r") { returned = true; continue; }
      if (!part) continue;
      if (!line) { line = document.createTextNode(""); out.appendChild(line); }
      if (part === "\n") { line.data += "\n"; line = null; }
      else if (returned) line.data = part;
      else line.data += part;
      returned = false;
    }
    while (out.childNodes.length > LOG_KEEP_NODES) out.removeChild(out.firstChild);
    after();
  };
}

async function filesPane(pane, id, keep) {
  const filter = el("input", { type: "search", placeholder: "Filter paths…" });
  const body = el("tbody");
  const note = el("span", { class: "count" });
  pane.append(el("div", { class: "toolbar" }, filter, note),
    el("table", { id: "files" }, el("thead", {}, el("tr", {}, ["Path", "Size", "Modified", ""].map(t => el("th", { text: t })))), body));
  // One page of the listing (the API pages it): a job with more files is fetched whole as an
  // archive, not listed into the page.
  const PAGE = 2000;
  let files = [], more = false;
  try {
    const page = await api(`/v1/jobs/${encodeURIComponent(id)}/files?limit=${PAGE}`);
    files = page.files; more = page.next_cursor !== null;
  } catch (e) { note.textContent = e.message; return; }
  keep(files);
  const archive = el("a", { href: `/v1/jobs/${encodeURIComponent(id)}/archive?path=outputs`, download: `${id}-outputs.tar`, text: "download outputs/ as one archive" });
  pane.querySelector(".toolbar").appendChild(archive);
  const rank = p => p.startsWith("outputs/") ? 0 : p.startsWith("stdouterr/") ? 1 : p.startsWith("wd/") ? 3 : 2;
  files.sort((a, b) => rank(a.path) - rank(b.path) || (a.path < b.path ? -1 : 1));
  function render() {
    const f = filter.value.toLowerCase(), shown = files.filter(x => x.path.toLowerCase().includes(f));
    body.textContent = "";
    for (const x of shown.slice(0, 1000)) {
      body.appendChild(el("tr", {}, el("td", { class: "mono", text: x.path }), el("td", { text: bytes(x.size) }),
        el("td", { text: ago(x.modified_at) }),
        el("td", {}, el("a", { href: `/v1/jobs/${encodeURIComponent(id)}/download?path=${encodeURIComponent(x.path)}`, download: x.path.split("/").pop(), text: "download" }))));
    }
    note.textContent = `${shown.length}${more ? "+" : ""} file(s)${shown.length > 1000 ? ", the first 1000 shown: filter to find others" : ""}${more ? `; only the first ${PAGE} are listed here (ringtrain job files lists all)` : ""}`;
  }
  filter.addEventListener("input", render);
  render();
}

function detailsPane(pane, job, files) {
  if (!job) { pane.appendChild(el("div", { class: "empty", text: "Loading…" })); return; }
  const kv = (k, v) => [el("dt", { text: k }), el("dd", { text: v === null || v === undefined || v === "" ? "—" : String(v) })];
  const t = x => x ? new Date(x * 1000).toLocaleString() : null;
  pane.append(el("div", { class: "grid2" },
    el("div", {}, el("h2", { text: "Job" }), el("dl", { class: "kv" },
      kv("state", job.state), kv("cluster", job.cluster), kv("nodes", job.nodes.join(", ")),
      kv("attempt", `${job.attempt + 1} of ${job.spec.max_retries + 1}`), kv("submitted", t(job.created_at)),
      kv("got nodes", t(job.started_at)), kv("running since", t(job.running_at)), kv("ended", t(job.ended_at)),
      kv("exit code", job.exit_code), kv("message", job.message), kv("folder", job.job_dir),
      kv("serves", job.serves))),
    el("div", {}, el("h2", { text: "Spec" }), el("pre", { class: "spec", text: JSON.stringify(job.spec, null, 2) }))));
  const attempts = new Map();
  for (const f of files || []) {
    const m = /^attempts\/(\d+)\//.exec(f.path);
    if (m) { if (!attempts.has(m[1])) attempts.set(m[1], []); attempts.get(m[1]).push(f.path); }
  }
  const box = el("div", { style: "margin-top:16px" }, el("h2", { text: "Attempts" }));
  if (!job.attempt) box.appendChild(el("div", { class: "count", text: "One attempt so far (no retries)." }));
  for (const [n, paths] of [...attempts.entries()].sort((a, b) => a[0] - b[0])) {
    const status = paths.find(p => p.endsWith("launcher/status.json"));
    const item = el("div", { class: "card", style: "margin-bottom:8px" }, el("b", { text: `attempt ${Number(n) + 1}` }), " ",
      el("span", { class: "count", text: `${paths.length} file(s) kept` }));
    if (status) {
      const pre = el("pre", { class: "spec", text: "…" });
      item.appendChild(pre);
      fetch(`/v1/jobs/${encodeURIComponent(job.id)}/download?path=${encodeURIComponent(status)}`).then(r => r.text())
        .then(txt => { try { pre.textContent = JSON.stringify(JSON.parse(txt), null, 2); } catch (e) { pre.textContent = txt; } });
    }
    box.appendChild(item);
  }
  if (job.attempt && !files) box.appendChild(el("div", { class: "count", text: "Open the Files tab once to list earlier attempts." }));
  pane.appendChild(box);
}

// -- clusters -------------------------------------------------------------------------------------

function clustersView(root) {
  const host = el("div", { class: "cards", id: "host-cards" });
  const list = el("div", { id: "clusters" });
  root.append(el("h1", { text: "Clusters" }), el("div", { class: "sub", text: "Nodes, their state and the job on each; the host's usage (local clusters' nodes run on it)." }),
    el("div", { class: "panel" }, el("h2", { text: "Service host" }), host), list);
  const machines = new Map();  // an attached cluster's machines, fetched once per view
  function render() {
    host.textContent = "";
    const h = state.host;
    if (h) {
      host.append(el("div", { class: "card" }, el("div", { class: "l", text: "CPU" }), el("div", { class: "n", text: `${h.cpu_percent.toFixed(0)}%` }), bar(h.cpu_percent), el("span", { class: "count", text: `${h.cpus} cores` })),
        el("div", { class: "card" }, el("div", { class: "l", text: "Memory" }), el("div", { class: "n", text: bytes(h.memory_used) }), bar(100 * h.memory_used / h.memory_total), el("span", { class: "count", text: `of ${bytes(h.memory_total)}` })));
      for (const g of h.gpus || []) {
        host.append(el("div", { class: "card" }, el("div", { class: "l", text: `GPU ${g.index} · ${g.name}` }), el("div", { class: "n", text: `${g.util_percent.toFixed(0)}%` }), bar(g.util_percent),
          el("span", { class: "count", text: `${bytes(g.memory_used)} of ${bytes(g.memory_total)}` })));
      }
      if (!(h.gpus || []).length) host.append(el("div", { class: "card" }, el("div", { class: "l", text: "GPUs" }), el("div", { class: "n", text: "none" }), el("span", { class: "count", text: "NVML not available" })));
      const d = h.disk;
      if (d) host.append(el("div", { class: "card", title: d.path }, el("div", { class: "l", text: "Disk" }), el("div", { class: "n", text: `${megabytes(d.free_bytes)} free` }), bar(100 - 100 * d.free_bytes / d.total_bytes),
        el("span", { class: "count", text: `of ${megabytes(d.total_bytes)}; new jobs need ${megabytes(d.floor_bytes)}${d.below_floor ? " (refused now)" : ""}` })));
    }
    list.textContent = "";
    if (!state.clusters.length) list.appendChild(el("div", { class: "panel empty", text: "No clusters: `ringtrain cluster create NAME --nodes N`." }));
    for (const c of state.clusters) {
      const counts = Object.entries(c.node_counts).filter(([, n]) => n).map(([s, n]) => `${n} ${s}`).join(", ") || "no nodes";
      // Jobs share a node's slots: a line per job in each cell, in the order they came.
      const rows = c.nodes.map(n => {
        const usage = n.jobs.map(j => (h && h.jobs ? h.jobs[j] : null) || null);
        const cpu = u => u && u.cpu_percent !== null ? `${u.cpu_percent.toFixed(0)}%` : "…";
        return el("tr", { "data-node": `${c.name}/${n.index}` }, el("td", { text: String(n.index) }), el("td", {}, badge(n.state)),
          el("td", { text: `${n.slots_used} / ${c.slots}` }),
          el("td", {}, n.jobs.length ? n.jobs.map(j => el("div", {}, el("a", { class: "mono", href: `#/jobs/${encodeURIComponent(j)}`, text: j }))) : "—"),
          el("td", {}, n.jobs.length ? usage.map(u => el("div", {}, u && u.cpu_percent !== null && n.jobs.length === 1 ? [bar(u.cpu_percent / (h.cpus || 1)), cpu(u)] : cpu(u))) : "—"),
          el("td", {}, n.jobs.length ? usage.map(u => el("div", { text: u ? `${bytes(u.memory)} · ${u.processes} proc.` : "…" })) : "—"),
          el("td", { text: c.address ? `${c.backend} machines` : "service host" }));
      });
      const panel = el("div", { class: "panel" },
        el("h2", {}, c.name, " ", el("span", { class: "count", text: `${c.backend} · ${c.slots} slot(s)/node, ${c.free_slots} free · ${c.allocation_state} · target ${c.target_nodes}${c.max_nodes ? ` (max ${c.max_nodes})` : ""} · ${counts}` })),
        el("table", {}, el("thead", {}, el("tr", {}, ["Node", "State", "Slots used", "Jobs", "Job CPU", "Job memory", "Runs on"].map(t => el("th", { text: t, title: t.startsWith("Job ") ? "each job's processes (all its nodes)" : null })))), el("tbody", {}, rows)));
      if (c.address) {  // attached: the machines its backend describes, and their usage
        const ms = machines.get(c.name);
        if (ms === undefined) { machines.set(c.name, null); api(`/v1/clusters/${encodeURIComponent(c.name)}`).then(x => { machines.set(c.name, x.machines); scheduleRender(); }).catch(() => {}); }
        if (ms && ms.length) {
          panel.append(el("h2", { style: "margin-top:14px", text: "Machines" }), el("table", {},
            el("thead", {}, el("tr", {}, ["Address", "Alive", "CPUs free", "GPUs free", "CPU use", "Memory", "GPU use"].map(t => el("th", { text: t })))),
            el("tbody", {}, ms.map(m => {
              const u = h && h.machines && h.machines[c.name] ? h.machines[c.name][m.id] : null;
              return el("tr", { "data-machine": m.id }, el("td", { class: "mono", text: m.address }), el("td", { text: m.alive ? "yes" : "no" }),
                el("td", { text: `${m.cpus_free} / ${m.cpus}` }), el("td", { text: `${m.gpus_free} / ${m.gpus}` }),
                el("td", {}, u ? [bar(u.cpu_percent), `${u.cpu_percent.toFixed(0)}%`] : "—"),
                el("td", { text: u ? `${bytes(u.memory_used)} / ${bytes(u.memory_total)}` : "—" }),
                el("td", { text: u && u.gpus.length ? u.gpus.map(g => `${g.util_percent.toFixed(0)}% · ${bytes(g.memory_used)}`).join(", ") : "—" }));
            }))));
        }
      }
      list.appendChild(panel);
    }
  }
  return { name: "clusters", onChange: render, cleanup: () => {} };
}

// -- deployments ----------------------------------------------------------------------------------

function deploymentsView(root) {
  const body = el("div", { id: "deployments" }, el("div", { class: "empty", text: "Loading…" }));
  root.append(el("h1", { text: "Deployments" }), el("div", { class: "sub", text: "Models served from succeeded jobs (`ringtrain job deploy ID`); refreshed every 3 s." }), body);
  async function load() {
    let list;
    try { list = await api("/v1/deployments"); } catch (e) { return; }
    body.textContent = "";
    if (!list.length) { body.appendChild(el("div", { class: "panel empty", text: "No deployments." })); return; }
    const metrics = await api("/v1/deployment-metrics").catch(() => ({}));
    for (const d of list) {
      const m = metrics[d.id] || [];
      body.appendChild(el("div", { class: "panel" },
        el("h2", {}, el("a", { class: "mono", href: `#/jobs/${encodeURIComponent(d.id)}`, text: d.id }), " ", badge(d.state),
          el("span", { class: "count", text: ` serves ${d.serves} · ${d.replicas} replica(s)` })),
        d.message ? el("div", { class: "count", text: d.message }) : null,
        d.url && d.replicas > 1 ? el("div", { class: "count mono", text: `front: ${d.url} · round robin over ${d.healthy.length} of ${d.replicas} healthy replica(s)` }) : null,
        el("table", {}, el("thead", {}, el("tr", {}, ["Replica", "State", "URL", "Requests/s", "p50", "p99", "Mean batch", "Errors"].map(t => el("th", { text: t })))),
          // One row a replica (its status when the service has one: a restarting replica has
          // no URL that listens); the metrics are by listening URL.
          el("tbody", {}, (d.replica_status && d.replica_status.length ? d.replica_status
                           : d.urls.map((url, index) => ({ index, url }))).map(st => {
            const u = st.url || "";
            const r = (u && m[d.urls.indexOf(u)]) || {};
            const ms = v => v === undefined || v === null ? "—" : `${(v * 1000).toFixed(1)} ms`;
            return el("tr", {}, el("td", { text: String(st.index) }),
              el("td", { title: st.message || "" }, st.state ? badge(st.state) : "—",
                st.restarts ? el("span", { class: "count", text: ` ${st.restarts} restart(s)` }) : null),
              el("td", { class: "mono", text: u || "—" }),
              el("td", { text: r.rate === undefined ? "—" : r.rate.toFixed(2) }), el("td", { text: ms(r.p50) }), el("td", { text: ms(r.p99) }),
              el("td", { text: r.mean_batch === undefined || r.mean_batch === null ? "—" : r.mean_batch.toFixed(1) }),
              el("td", { text: r.errors === undefined ? (r.error || "—") : String(r.errors) }));
          })))));
    }
  }
  load();
  const timer = setInterval(load, 3000);
  return { name: "deployments", onChange: () => {}, cleanup: () => clearInterval(timer) };
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => { connect(); route(); });
