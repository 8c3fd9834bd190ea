// The raylet dashboard: one script draws every page from the JSON API.
// Data is only ever put into the page as text, never as HTML.
"use strict";

const PAGES = [
  ["", "Overview", overview],
  ["jobs", "Jobs", jobsPage],
  ["actors", "Actors", actorsPage],
  ["tasks", "Tasks", tasksPage],
  ["placement-groups", "Placement groups", groupsPage],
  ["objects", "Object store", objectsPage],
  ["train", "Train & Tune", trainPage],
  ["serve", "Serve", servePage],
];
const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#0a7ea4", "#bf3989", "#57606a"];
const REFRESH_MS = 4000;

window.addEventListener("error", (event) => showError(String(event.message)));
window.addEventListener("unhandledrejection", (event) => showError(String(event.reason)));

function showError(message) {
  const box = document.getElementById("errors");
  box.hidden = false;
  box.textContent = message;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  if (response.status === 401) {
    window.location.href = "/login";
    throw new Error("logged out");
  }
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function short(id) { return id ? String(id).slice(0, 8) : "-"; }
function when(ms) { return ms ? new Date(ms).toLocaleTimeString() : "-"; }
function state(text) { return el("span", { class: `state-${text}` }, text); }
function amount(set, name) { return (set && set[name]) || 0; }

// A table; `columns` are [header, row => cell] pairs.
function table(columns, rows, options) {
  const opts = options || {};
  if (!rows.length) return el("p", { class: "empty" }, opts.empty || "None yet.");
  const head = el("tr", {}, columns.map(([title]) => el("th", {}, title)));
  const body = rows.map((row) => {
    const tr = el("tr", opts.onselect ? { class: "selectable", onclick: () => opts.onselect(row) } : {},
      columns.map(([, cell]) => el("td", {}, cell(row))));
    if (opts.selected && opts.selected(row)) tr.classList.add("selected");
    return tr;
  });
  return el("table", { id: opts.id || "" }, el("thead", {}, head), el("tbody", {}, body));
}

// A line chart of `series` ([{name, points: [[x, y]]}]) as SVG.
function lineChart(title, series, options) {
  const opts = options || {};
  const width = opts.width || 420, height = opts.height || 170, pad = 34;
  const all = series.flatMap((s) => s.points);
  const box = el("div", { class: "chart", "data-chart": title }, el("h3", {}, title));
  if (!all.length) { box.append(el("p", { class: "empty" }, "No samples yet.")); return box; }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const xMin = Math.min(...xs), xMax = Math.max(...xs, xMin + 1);
  const yMin = opts.yMin !== undefined ? opts.yMin : Math.min(...ys);
  const yMax = opts.yMax !== undefined ? opts.yMax : Math.max(...ys, yMin + 1e-9);
  const x = (v) => pad + ((v - xMin) / (xMax - xMin)) * (width - pad - 8);
  const y = (v) => height - pad + 10 - ((v - yMin) / (yMax - yMin || 1)) * (height - pad - 8);
  const chart = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
  for (let i = 0; i <= 4; i++) {
    const v = yMin + ((yMax - yMin) * i) / 4;
    chart.append(svg("line", { class: "grid", x1: pad, x2: width - 8, y1: y(v), y2: y(v) }));
    const label = svg("text", { x: 2, y: y(v) + 3 });
    label.textContent = Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3);
    chart.append(label);
  }
  chart.append(svg("line", { class: "axis", x1: pad, x2: pad, y1: 4, y2: height - pad + 10 }));
  chart.append(svg("line", { class: "axis", x1: pad, x2: width - 8, y1: height - pad + 10, y2: height - pad + 10 }));
  const xLabel = svg("text", { x: pad, y: height - 4 });
  xLabel.textContent = opts.xLabel || "";
  chart.append(xLabel);
  const legend = el("div", { class: "legend" });
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const points = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { class: "series", points, stroke: color, "data-series": s.name }));
    legend.append(el("span", { style: `--color: ${color}` }, s.name));
  });
  box.append(chart, legend);
  return box;
}

function card(label, value) {
  return el("div", { class: "card" }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
}

async function overview() {
  const [nodes, history, summary] = await Promise.all([
    api("/api/nodes"), api("/api/cluster_history"), api("/api/tasks/summary"),
  ]);
  const alive = nodes.filter((n) => n.state === "ALIVE");
  const cpuTotal = alive.reduce((sum, n) => sum + amount(n.total, "CPU"), 0);
  const cpuFree = alive.reduce((sum, n) => sum + amount(n.available, "CPU"), 0);
  const gpuTotal = alive.reduce((sum, n) => sum + amount(n.total, "GPU"), 0);
  const gpuFree = alive.reduce((sum, n) => sum + amount(n.available, "GPU"), 0);
  const taskCount = (wanted) => summary.reduce((sum, f) => sum + (f.states[wanted] || 0), 0);
  const series = (field) => alive.map((n) => ({
    name: `${short(n.node_id)}${n.is_head_node ? " (head)" : ""}`,
    points: history.map((s) => [s.unix_ms / 1000, (s.nodes.find((x) => x.node_id === n.node_id) || {})[field]])
      .filter((p) => p[1] !== undefined),
  }));
  const start = history.length ? history[0].unix_ms : Date.now();
  const since = `seconds, from ${when(start)}`;
  return [
    el("div", { class: "cards" },
      card("nodes alive", `${alive.length} / ${nodes.length}`),
      card("CPUs in use", `${(cpuTotal - cpuFree).toFixed(1)} / ${cpuTotal}`),
      card("GPUs in use", `${(gpuTotal - gpuFree).toFixed(1)} / ${gpuTotal}`),
      card("tasks running", taskCount("RUNNING") + taskCount("SUBMITTED_TO_WORKER")),
      card("tasks finished", taskCount("FINISHED")),
      card("tasks failed", taskCount("FAILED"))),
    el("h2", {}, "Utilization"),
    el("div", { class: "charts", id: "utilization" },
      lineChart("CPU %", series("cpu_percent"), { yMin: 0, yMax: 100, xLabel: since }),
      lineChart("Memory %", series("memory_percent"), { yMin: 0, yMax: 100, xLabel: since }),
      lineChart("GPUs leased %", series("gpu_percent"), { yMin: 0, yMax: 100, xLabel: since }),
      lineChart("GPU utilization %", series("gpu_utilization_percent"), { yMin: 0, yMax: 100, xLabel: since })),
    el("h2", {}, "Nodes"),
    table([
      ["Node", (n) => el("span", { class: "mono" }, n.node_id)],
      ["Address", (n) => n.address],
      ["Host", (n) => n.hostname],
      ["State", (n) => state(n.state)],
      ["Head", (n) => (n.is_head_node ? "yes" : "")],
      ["CPU", (n) => `${(amount(n.total, "CPU") - amount(n.available, "CPU")).toFixed(1)} / ${amount(n.total, "CPU")}`],
      ["GPU", (n) => `${(amount(n.total, "GPU") - amount(n.available, "GPU")).toFixed(1)} / ${amount(n.total, "GPU")}`],
      ["CPU %", (n) => n.stats.cpu_percent.toFixed(0)],
      ["Memory", (n) => `${bytes(n.stats.memory_used_bytes)} / ${bytes(n.stats.memory_total_bytes)}`],
    ], nodes, { id: "nodes" }),
    el("h2", {}, "GPUs"),
    table([
      ["Node", (g) => el("span", { class: "mono" }, short(g.node_id))],
      ["GPU", (g) => String(g.index)],
      ["Model", (g) => g.name],
      ["Busy %", (g) => (g.fault ? "" : g.utilization_percent.toFixed(0))],
      ["Memory", (g) => (g.fault ? "" : `${bytes(g.memory_used_bytes)} / ${bytes(g.memory_total_bytes)}`)],
      ["State", (g) => (g.fault ? `unusable: ${g.fault}` : "ok")],
    ], alive.flatMap((n) => n.stats.gpus.map((g) => ({ node_id: n.node_id, ...g }))), { id: "gpus", empty: "No GPUs detected." }),
  ];
}

let selectedJob = null;

async function jobsPage() {
  const jobs = (await api("/api/jobs")).sort((a, b) => b.submitted_unix_ms - a.submitted_unix_ms);
  if (!selectedJob && jobs.length) selectedJob = jobs[0].id;
  const logs = selectedJob ? (await api(`/api/jobs/${selectedJob}/logs?tail_bytes=65536`)).logs : "";
  return [
    el("h2", {}, `Jobs (${jobs.length})`),
    table([
      ["Job", (j) => el("span", { class: "mono" }, j.id)],
      ["Name", (j) => j.name],
      ["Status", (j) => state(j.status)],
      ["Entrypoint", (j) => j.entrypoint.join(" ")],
      ["Submitted", (j) => when(j.submitted_unix_ms)],
      ["Ended", (j) => when(j.ended_unix_ms)],
      ["Exit", (j) => (j.exit_code === null ? "" : j.exit_code)],
      ["Message", (j) => j.message],
    ], jobs, { id: "jobs", onselect: (j) => { selectedJob = j.id; draw(); }, selected: (j) => j.id === selectedJob }),
    el("h2", {}, selectedJob ? `Output of ${selectedJob}` : "Output"),
    el("pre", { class: "logs", id: "job-logs" }, logs || "(no output yet)"),
  ];
}

async function actorsPage() {
  const actors = await api("/api/actors");
  return [
    el("h2", {}, `Actors (${actors.length})`),
    table([
      ["Actor", (a) => el("span", { class: "mono" }, a.id)],
      ["Class", (a) => a.class_name],
      ["Name", (a) => a.name],
      ["State", (a) => state(a.state)],
      ["Node", (a) => short(a.node_id)],
      ["Pid", (a) => a.pid || ""],
      ["Restarts", (a) => a.restarts],
      ["Death cause", (a) => a.death_cause],
    ], actors, { id: "actors" }),
  ];
}

async function tasksPage() {
  const [summary, listing] = await Promise.all([api("/api/tasks/summary"), api("/api/tasks?limit=200")]);
  const states = [...new Set(summary.flatMap((f) => Object.keys(f.states)))].sort();
  return [
    el("h2", {}, "By function and state"),
    table([
      ["Function", (f) => f.name],
      ["Kind", (f) => f.kind],
      ...states.map((s) => [s, (f) => f.states[s] || ""]),
      ["Mean run ms", (f) => (f.mean_duration_ms === null ? "-" : f.mean_duration_ms.toFixed(2))],
    ], summary, { id: "task-summary" }),
    el("h2", {}, `Newest attempts (${listing.tasks.length} of ${listing.total})`),
    table([
      ["Task", (t) => el("span", { class: "mono" }, t.task_id)],
      ["Try", (t) => t.attempt],
      ["Name", (t) => t.name],
      ["State", (t) => state(t.state)],
      ["Node", (t) => short(t.node_id)],
      ["Pid", (t) => t.worker_pid || ""],
      ["Run ms", (t) => (t.duration_ms === null ? "-" : t.duration_ms.toFixed(1))],
      ["Items", (t) => (t.items_yielded === null ? "-" : t.items_yielded)],
      ["Error", (t) => (t.error || "").split("\n")[0]],
    ], listing.tasks, { id: "tasks" }),
  ];
}

async function groupsPage() {
  const groups = await api("/api/placement_groups");
  return [
    el("h2", {}, `Placement groups (${groups.length})`),
    table([
      ["Group", (g) => el("span", { class: "mono" }, g.id)],
      ["Name", (g) => g.name],
      ["Strategy", (g) => g.strategy],
      ["State", (g) => state(g.state)],
      ["Bundles", (g) => g.bundles.map((b) => Object.entries(b).map(([k, v]) => `${k}:${v}`).join(" ")).join(" | ")],
      ["Nodes", (g) => g.nodes.map(short).join(", ")],
      ["Reason", (g) => g.reason],
    ], groups, { id: "placement-groups" }),
  ];
}

async function objectsPage() {
  const stores = await api("/api/objects");
  const bar = (used, total) => el("span", { class: "bar" }, el("div", { style: `width: ${total ? (100 * used) / total : 0}%` }));
  const objects = stores.flatMap((s) => s.objects.map((o) => ({ ...o, node: s.node_id })));
  return [
    el("h2", {}, "Stores"),
    table([
      ["Node", (s) => el("span", { class: "mono" }, s.node_id)],
      ["Address", (s) => s.address],
      ["Used", (s) => [bar(s.used_bytes, s.capacity_bytes), ` ${bytes(s.used_bytes)} / ${bytes(s.capacity_bytes)}`]],
      ["Spilled", (s) => bytes(s.spilled_bytes)],
      ["Served", (s) => bytes(s.served_bytes)],
      ["Pulled", (s) => bytes(s.pulled_bytes)],
      ["Objects", (s) => s.objects.length],
    ], stores, { id: "stores" }),
    el("h2", {}, `Objects (${objects.length})`),
    table([
      ["Object", (o) => el("span", { class: "mono" }, o.id)],
      ["Node", (o) => short(o.node)],
      ["Size", (o) => bytes(o.size)],
      ["Spilled", (o) => (o.spilled ? "yes" : "")],
      ["Owner", (o) => o.owner],
    ], objects.slice(0, 500), { id: "objects" }),
  ];
}

function metricNames(rows) {
  return [...new Set(rows.flatMap((r) => Object.keys(r.metrics || {})))].sort();
}

async function trainPage() {
  const [runs, experiments] = await Promise.all([api("/api/train"), api("/api/tune")]);
  const parts = [el("h2", {}, `Train runs (${runs.length})`)];
  parts.push(table([
    ["Run", (r) => r.name],
    ["Status", (r) => state(r.status)],
    ["Workers", (r) => r.workers],
    ["Reports", (r) => r.reports.length],
    ["Latest", (r) => Object.entries((r.reports[r.reports.length - 1] || {}).metrics || {})
      .map(([k, v]) => `${k}=${Number(v).toPrecision(4)}`).join(" ")],
    ["Updated", (r) => when(r.updated_ms)],
  ], runs, { id: "train-runs", empty: "No Train run has reported yet." }));
  const trainMetrics = metricNames(runs.flatMap((r) => r.reports));
  parts.push(el("div", { class: "charts", id: "train-curves" }, trainMetrics.map((metric) =>
    lineChart(metric, runs.map((r) => ({
      name: r.name,
      points: r.reports.filter((p) => typeof p.metrics[metric] === "number").map((p) => [p.index, p.metrics[metric]]),
    })), { xLabel: "report" }))));
  parts.push(el("h2", {}, `Tune experiments (${experiments.length})`));
  for (const experiment of experiments) {
    const params = [...new Set(experiment.trials.flatMap((t) => Object.keys(t.config)))].sort();
    parts.push(el("h3", {}, `${experiment.name}: ${experiment.status}, ${experiment.mode} ${experiment.metric}`));
    parts.push(table([
      ["Trial", (t) => t.id],
      ["Status", (t) => state(t.status)],
      ...params.map((p) => [p, (t) => JSON.stringify(t.config[p])]),
      ["Iterations", (t) => t.iterations],
      [experiment.metric, (t) => (t.last && typeof t.last[experiment.metric] === "number"
        ? t.last[experiment.metric].toPrecision(4) : "-")],
      ["Error", (t) => t.error || ""],
    ], experiment.trials, { id: "trials" }));
    parts.push(el("div", { class: "charts" }, lineChart(experiment.metric, experiment.trials.map((t) => ({
      name: t.id,
      points: t.history.filter((h) => typeof h.metrics[experiment.metric] === "number")
        .map((h) => [h.iteration, h.metrics[experiment.metric]]),
    })), { xLabel: "iteration", width: 640 })));
  }
  if (!experiments.length) parts.push(el("p", { class: "empty" }, "No Tune experiment has reported yet."));
  return parts;
}

// How many replicas are in each state, e.g. "2 RUNNING, 1 STARTING".
function replicaCounts(replicas) {
  const counts = {};
  for (const r of replicas) counts[r.state] = (counts[r.state] || 0) + 1;
  const text = Object.keys(counts).sort().map((s) => `${counts[s]} ${s}`).join(", ");
  return text || "0";
}

// A deployment's own figures, e.g. "tokens_per_s: 812.5, ttft_p99_s: 0.123".
function figures(list) {
  const text = (list || []).map((f) => `${f.name}: ${Math.round(f.value * 1000) / 1000}`).join(", ");
  return text || "-";
}

async function servePage() {
  const status = await api("/api/serve");
  if (!status) return [el("h2", {}, "Serve"), el("p", { class: "empty", id: "serve-absent" }, "Serve is not running on this cluster.")];
  const deployments = status.apps.flatMap((a) => a.deployments.map((d) => ({ ...d, app: a.name })));
  const replicas = deployments.flatMap((d) => d.replicas.map((r) => ({ ...r, app: d.app, deployment: d.name })));
  const scaling = deployments.filter((d) => d.autoscaling);
  const sum = (rows, value) => rows.reduce((total, row) => total + value(row), 0);
  return [
    el("div", { class: "cards" },
      card("applications", status.apps.length),
      card("replicas running", replicas.filter((r) => r.state === "RUNNING").length),
      card("requests ongoing", sum(replicas, (r) => r.ongoing)),
      card("requests", sum(deployments, (d) => d.requests.total)),
      card("errors", sum(deployments, (d) => d.requests.errors))),
    el("p", { id: "serve-controller" },
      `Controller: pid ${status.controller.pid} on node ${short(status.controller.node_id)}; status of ${when(status.updated_at_ms)}`),
    el("h2", {}, `Applications (${status.apps.length})`),
    table([
      ["Application", (a) => a.name],
      ["Route", (a) => a.route_prefix],
      ["Public", (a) => (a.public ? "yes" : "no")],
      ["State", (a) => state(a.state)],
      ["Message", (a) => a.message],
    ], status.apps, { id: "serve-apps", empty: "No application is deployed." }),
    el("h2", {}, `Deployments (${deployments.length})`),
    table([
      ["Application", (d) => d.app],
      ["Deployment", (d) => d.name],
      ["Class", (d) => d.class],
      ["Version", (d) => el("span", { class: "mono" }, d.version)],
      ["Target", (d) => d.target_replicas],
      ["Replicas", (d) => replicaCounts(d.replicas)],
      ["Ongoing", (d) => `${sum(d.replicas, (r) => r.ongoing)} (max ${d.max_ongoing_requests} each)`],
      ["Requests", (d) => d.requests.total],
      ["Errors", (d) => d.requests.errors],
      ["Autoscaling", (d) => (d.autoscaling ? d.autoscaling.decision : "-")],
      ["Figures", (d) => figures(d.figures)],
    ], deployments, { id: "serve-deployments" }),
    el("h2", {}, `Autoscaling (${scaling.length})`),
    table([
      ["Deployment", (d) => `${d.app}/${d.name}`],
      ["Min", (d) => d.autoscaling.min_replicas],
      ["Max", (d) => d.autoscaling.max_replicas],
      ["Target ongoing", (d) => d.autoscaling.target_ongoing_requests],
      ["Current", (d) => d.autoscaling.current],
      ["Desired", (d) => d.autoscaling.desired],
      ["Average ongoing", (d) => d.autoscaling.average_ongoing.toFixed(1)],
      ["Queued", (d) => d.autoscaling.queued],
      ["Decision", (d) => d.autoscaling.decision],
    ], scaling, { id: "serve-autoscaling", empty: "No deployment autoscales." }),
    el("h2", {}, `Replicas (${replicas.length})`),
    table([
      ["Replica", (r) => el("span", { class: "mono" }, r.name)],
      ["Application", (r) => r.app],
      ["Deployment", (r) => r.deployment],
      ["State", (r) => state(r.state)],
      ["Version", (r) => el("span", { class: "mono" }, r.version)],
      ["Node", (r) => short(r.node_id)],
      ["Pid", (r) => r.pid || ""],
      ["Ongoing", (r) => r.ongoing],
    ], replicas, { id: "serve-replicas" }),
    el("h2", {}, `Proxies (${status.proxies.length})`),
    table([
      ["Address", (p) => p.address],
      ["Node", (p) => el("span", { class: "mono" }, p.node_id)],
    ], status.proxies, { id: "serve-proxies" }),
  ];
}

const current = PAGES.find(([path]) => window.location.pathname.replace(/^\/ui\/?/, "").replace(/\/$/, "") === path)
  || PAGES[0];

async function draw() {
  try {
    const parts = await current[2]();
    document.getElementById("page").replaceChildren(...[parts].flat());
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.ready = "true";
  } catch (error) {
    showError(`${current[1]}: ${error.message || error}`);
  }
}

document.getElementById("nav").append(...PAGES.map(([path, title]) =>
  el("a", { href: `/ui/${path}`, class: path === current[0] ? "current" : "" }, title)));
document.title = `raylet · ${current[1]}`;
draw();
setInterval(draw, REFRESH_MS);
