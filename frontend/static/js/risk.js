// Fault risk, on the job page and the dashboard. Each node's supervisor (workers/reliability/risk_watch.py)
// publishes on the job's stream a `telemetry` event every few seconds (the node's metrics; `absent`: the
// sources it cannot read and why, sent with the first sample and again when it changes) and after each a
// `risk` event (the node's risk: the larger of the ranks' straggler scores and the failure model's figure,
// with each rank's score, the straggler detector's status and what the failure model is, or why there is
// none); a rank flagged or cleared is a `risk` event at once, with `flag`; a prevention action (a warning,
// a snapshot now, a drain, with its status and outcome) is a `risk` event with `action` and no scores.
//
// The job page (FaultRiskPanel): the job's badge, each node's newest risk with its flagged ranks and their
// reasons, the flags and actions as a timeline, risk over time (one line per node, flags and actions
// marked), and per node its
// telemetry over time (CPU, memory, each rank's median step time) with the sources it lacks. History first,
// then live, as the energy panel (job_energy.js). The dashboard (LiveRiskBadges): one badge per running job, read
// from the job API's `risk` and updated by live risk events.
import { COLORS, PLOT_CONFIG, chartLayout, reactWhenSeen, referenceLine, withReferences } from "./charts.js";
import { MISSING, formatNumber, formatPercent, formatSeconds, getJSON, h } from "./common.js";

// issue 14's tiers (workers/reliability/risk_watch.py risk_level): warn at 0.6, act at 0.85
export const WARN_RISK = 0.6;
export const ACT_RISK = 0.85;
const FLAG_COLORS = { raised: "#cf222e", cleared: "#1a7f37" };
// an action's status as the timeline's pill shows it (the job states' colours)
const ACTION_PILL = { done: "succeeded", sent: "running", requested: "running", observed: "cancelled",
                      refused: "failed", unanswered: "failed" };
// the node telemetry chart's fixed series; any other metric a node reports can be added from a menu
const CPU_UTIL = "cpu.util_pct";
const MEM_USED = "mem.used_pct";
const RANK_STEP_P50 = /^job\.rank(\d+)\.step_time_p50_s$/;

export function riskLevel(risk) {
  if (risk == null || !Number.isFinite(risk)) return null;
  return risk >= ACT_RISK ? "high" : risk >= WARN_RISK ? "medium" : "low";
}

// the states in which a job has a live risk badge (the job page's and the dashboard's alike)
const SCORED_STATES = new Set(["launching", "running", "recovering"]);
const NOT_SCORED_TITLE = "not running: no live risk score";

// The job's risk from its nodes' newest scores (controlplane/jobs/selectors.py job_risk, same rule): the
// riskiest node's level, and the badge: high / medium when a node is there, else "unprotected" for a job
// that takes no snapshots (a failure would cost the whole run), else low. `isProtected` null: not known
// (the badge is then the level). No node scored yet: null.
export function jobRisk(nodes, isProtected) {
  if (!nodes.length) return null;
  const scored = nodes.map((n) => n.risk).filter((r) => r != null && Number.isFinite(r));
  const risk = scored.length ? Math.max(...scored) : null;
  const level = riskLevel(risk);
  const badge = level === "high" || level === "medium" ? level
    : isProtected == null ? level : isProtected ? "low" : "unprotected";
  return { risk, level, protected: isProtected, badge };
}

// The badge's hover text: risk and level, and what "unprotected" means
export function badgeTitle(r) {
  if (!r) return "no risk score yet";
  const parts = [r.risk != null ? `risk ${formatNumber(r.risk, 2)} (${r.level})` : "risk not scored yet"];
  if (r.protected === false) parts.push("no snapshots: a failure would cost the whole run");
  else if (r.protected) parts.push("snapshots on: a failure costs the steps since the last one");
  return parts.join(" · ");
}

// Fill a badge element (<span class="risk-badge">) from a job's risk (the API's `risk`, or jobRisk's)
export function setBadge(el, r) {
  const badge = (r && r.badge) || "none";
  el.textContent = badge === "none" ? MISSING : badge;
  el.dataset.badge = badge;
  el.title = badgeTitle(r);
  if (r && r.risk != null) el.dataset.risk = r.risk; else delete el.dataset.risk;
}

// A job's badge by the one rule of the job page and the dashboard's rows: its risk (`r`, jobRisk's) while it
// runs, else none, titled why (a queued job has no score yet; one that no longer runs has no live one)
export function setJobBadge(el, state, r) {
  const scored = SCORED_STATES.has(state);
  setBadge(el, scored ? r : null);
  if (!scored && state !== "queued") el.title = NOT_SCORED_TITLE;
}

export function riskBadge(r) {
  const el = h("span", { class: "risk-badge" });
  setBadge(el, r);
  return el;
}

// What the straggler detector does on a node, or why it cannot (too few ranks to compare)
export function describeStraggler(s) {
  if (!s) return MISSING;
  if (s.absent) return `not scoring: ${s.absent}`;
  return [s.signal ? `signal: ${s.signal === "compute" ? "compute time (step minus collective wait)" : s.signal.replaceAll("_", " ")}`
    : "signal: not chosen yet", `${formatNumber(s.buckets_scored)} bucket(s)`, `${formatNumber(s.steps_scored)} step(s) scored`]
    .join(" · ");
}

// What the failure model is (and what data it was trained on), or why there is none
export function describeFailure(f) {
  if (!f) return MISSING;
  const trained = f.trained_on ? `trained on ${f.trained_on}` : "";
  if (f.absent && !f.model) return `none: ${f.absent}`;
  if (f.absent) return [`${f.model}`, trained, `not scoring yet: ${f.absent}`].filter(Boolean).join(" · ");
  return [`${f.model || "model"}: risk ${formatNumber(f.risk, 2)}`,
    f.horizon_s != null && `of a failure within ${formatSeconds(f.horizon_s)}`,
    f.threshold != null && `alarm at ${formatNumber(f.threshold, 2)}`, trained].filter(Boolean).join(" · ");
}

// "rank 3 raised on node-a at step 118 (score 1.00, 45% of the time waited for it): reason"
export function describeFlag(f) {
  const where = [f.node && `on ${f.node}`, f.step != null && `at step ${formatNumber(f.step)}`].filter(Boolean).join(" ");
  const figures = [f.score != null && `score ${formatNumber(f.score, 2)}`,
    f.share != null && `${formatPercent(f.share, 0)} of the time waited for it`].filter(Boolean).join(", ");
  return `rank ${f.rank} ${f.event || "raised"}${where ? ` ${where}` : ""}${figures ? ` (${figures})` : ""}` +
    (f.reason ? `: ${f.reason}` : "");
}

// "snapshot-now done on node-a at step 118 (risk 1.00): step 120 taken, 40 steps protected, stall 0.21 s: reason"
export function describeAction(a) {
  const o = a.outcome || {};
  const outcome = [o.step != null && `taken after step ${formatNumber(o.step)}` + (o.snapshot ? ` (${o.snapshot})` : ""),
    o.steps_protected != null && `${formatNumber(o.steps_protected)} step(s) protected`,
    o.stall_s != null && `stall ${formatSeconds(o.stall_s)}`].filter(Boolean).join(", ");
  const where = [a.drain_node ? `of ${a.drain_node} by ${a.node}` : a.node && `on ${a.node}`,
    a.at_step != null && `at step ${formatNumber(a.at_step)}`].filter(Boolean).join(" ");
  return `${a.action} ${a.status}${where ? ` ${where}` : ""}` + (a.risk != null ? ` (risk ${formatNumber(a.risk, 2)})` : "") +
    (outcome ? `: ${outcome}` : "") + (a.note ? ` — ${a.note}` : "") + (a.reason ? `. Why: ${a.reason}` : "");
}

// An ISO time as Plotly draws it on a date axis: local wall-clock time, no zone (as the page's other times)
function localTime(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return null;
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:` +
    `${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

const clockTime = (iso) => {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? "" : d.toLocaleTimeString([], { hour12: false });
};

// "cpu.load1" -> its unit from the name's suffix, for the axis title
function unitOf(key) {
  const m = key.match(/_(pct|s|Bps|GiB|MiB|MHz|C|W|per_s)$/);
  return m ? { pct: "%", s: "s", Bps: "B/s", GiB: "GiB", MiB: "MiB", MHz: "MHz", C: "°C", W: "W", per_s: "/s" }[m[1]] : "";
}

// ------------------------------------------------------------------------------------- job page

export class FaultRiskPanel {
  // page: the job page's data; currentAttempt(): the attempt the job is on now (job_series.js AttemptTracker);
  // the panel's element says whether the job takes snapshots (data-protected)
  constructor(page, currentAttempt, state = () => page.state) {
    this.page = page;
    this.currentAttempt = currentAttempt;
    this.state = state;  // the job's state now: a job not running has no live risk (as on the dashboard)
    this.el = (id) => document.getElementById(id);
    const panel = this.el("risk-panel");
    this.protected = panel ? panel.dataset.protected === "yes" : null;
    this.nodes = new Map();      // node -> its newest risk event's values (+ time, attempt), any attempt
    this.riskPoints = new Map(); // node -> [{t, risk, level}], every attempt
    this.flags = [];             // flag dicts (+ node, time, attempt) in the order they came
    this.actions = [];           // prevention actions (+ node, time, attempt), likewise
    this.telemetry = new Map();  // node -> {node_rank, samples: [{t, metrics}], absent, cost}
    this.metricKeys = new Set(); // every metric any node reported (the "also chart" menu)
    this.extra = "";
  }

  // a `telemetry` or `risk` event (history or live); `attempt`: the attempt it belongs to
  note(e, attempt) {
    const v = e.values || {};
    const node = String(v.node ?? "?");
    const a = v.attempt || attempt;
    if (e.kind === "telemetry") {
      if (!this.telemetry.has(node)) this.telemetry.set(node, { node_rank: v.node_rank, samples: [], absent: null });
      const n = this.telemetry.get(node);
      n.node_rank = v.node_rank ?? n.node_rank;
      const metrics = v.metrics || {};
      n.samples.push({ t: localTime(v.sampled_at || e.time), attempt: a, metrics });
      for (const k of Object.keys(metrics)) this.metricKeys.add(k);
      if (v.absent) n.absent = v.absent;  // sent with the first sample and when it changes: the last one holds
      if (v.cost) n.cost = v.cost;
    } else if (e.kind === "risk" && v.action) {  // what was done, not the node's scores
      this.actions.push({ ...v.action, node, time: e.time, attempt: a, seq: e.seq });
    } else if (e.kind === "risk") {
      this.nodes.set(node, { ...v, node, time: e.time, attempt: a, step: e.step });
      if (!this.riskPoints.has(node)) this.riskPoints.set(node, []);
      this.riskPoints.get(node).push({ t: localTime(e.time), risk: v.risk ?? null, level: v.level });
      if (v.flag) this.flags.push({ ...v.flag, node, time: e.time, attempt: a, seq: e.seq });
    }
  }

  // the nodes of the current attempt, by node rank
  currentNodes() {
    const attempt = this.currentAttempt();
    return [...this.nodes.values()].filter((n) => n.attempt === attempt)
      .sort((a, b) => (a.node_rank ?? 1e9) - (b.node_rank ?? 1e9) || a.node.localeCompare(b.node));
  }

  render() {
    if (!this.el("risk-panel")) return;
    this.renderRisk();
    this.renderFlags();
    this.renderRiskChart();
    this.renderTelemetry();
  }

  renderRisk() {
    const nodes = this.currentNodes();
    setJobBadge(this.el("risk-badge"), this.state(), jobRisk(nodes, this.protected));
    this.el("risk-empty").hidden = nodes.length > 0;
    this.el("risk-nodes").replaceChildren(...nodes.map((n) => {
      const flagged = (n.ranks || []).filter((x) => x.flagged);
      const level = n.level || "none";
      return h("li", { class: "risk-node", dataset: { node: n.node, level } },
        h("div", { class: "risk-node-head" },
          h("strong", {}, n.node), n.node_rank != null ? h("span", { class: "muted" }, ` node ${n.node_rank}`) : null, " · ",
          h("span", { class: "risk-level", dataset: { level }, title: `medium at ${WARN_RISK}, high at ${ACT_RISK}` },
            n.risk != null ? `risk ${formatNumber(n.risk, 2)} ${n.level}` : "not scored"),
          h("span", { class: "muted small-inline" }, ` at ${clockTime(n.time)}` + (n.step != null ? `, step ${formatNumber(n.step)}` : ""))),
        h("div", { class: "straggler" }, h("span", { class: "muted" }, "Straggler detector: "), describeStraggler(n.straggler)),
        h("div", { class: "failure-model" }, h("span", { class: "muted" }, "Failure model: "), describeFailure(n.failure)),
        flagged.length ? h("ul", { class: "flagged-ranks" }, flagged.map((x) => h("li", { dataset: { rank: x.rank } },
          h("strong", {}, `rank ${x.rank}`), ` (score ${formatNumber(x.score, 2)}): ${x.reason || "flagged"}`)))
          : h("div", { class: "muted small-inline no-flagged" }, `no rank flagged (${(n.ranks || []).length} scored)`));
    }));
  }

  // flags and actions, newest first
  renderFlags() {
    const entries = [...this.flags.map((f) => ({ flag: f })), ...this.actions.map((a) => ({ action: a }))]
      .sort((x, y) => ((y.flag || y.action).seq ?? 0) - ((x.flag || x.action).seq ?? 0));
    const many = new Set(entries.map((x) => (x.flag || x.action).attempt)).size > 1;
    this.el("risk-flags").replaceChildren(...entries.map(({ flag: f, action: a }) => {
      const x = f || a;
      const pill = f ? h("span", { class: `state ${f.event === "cleared" ? "succeeded" : "failed"}` }, f.event === "cleared" ? "cleared" : "raised")
        : h("span", { class: `state ${ACTION_PILL[a.status] || ""}` }, a.action);
      return h("li", { dataset: f ? { event: f.event || "raised", rank: f.rank } : { action: a.action, status: a.status } },
        h("time", { datetime: x.time }, clockTime(x.time)), " ", pill, " ",
        h("span", { class: "detail" }, (many ? `attempt ${x.attempt} · ` : "") + (f ? describeFlag(f) : describeAction(a))));
    }));
    this.el("risk-flags-empty").hidden = entries.length > 0;
  }

  // risk over time, one line per node; the flags as markers at the flagged node's risk then
  renderRiskChart() {
    const div = this.el("chart-risk");
    const nodes = [...this.riskPoints.keys()].sort();
    const traces = nodes.map((node, i) => {
      const pts = this.riskPoints.get(node);
      return { type: "scatter", mode: "lines+markers", name: node, x: pts.map((p) => p.t), y: pts.map((p) => p.risk),
               line: { color: COLORS[i % COLORS.length], width: 2 }, marker: { size: 4 }, connectgaps: false };
    });
    for (const event of ["raised", "cleared"]) {
      const flags = this.flags.filter((f) => (f.event || "raised") === event);
      if (!flags.length) continue;
      traces.push({
        type: "scatter", mode: "markers", name: `flag ${event}`, x: flags.map((f) => localTime(f.time)),
        y: flags.map((f) => (event === "raised" ? f.score ?? 1 : 0)),
        hovertext: flags.map(describeFlag), hovertemplate: "%{hovertext}<extra></extra>",
        marker: { symbol: event === "raised" ? "triangle-up" : "circle-open", size: 11, color: FLAG_COLORS[event] },
      });
    }
    if (this.actions.length) {
      traces.push({
        type: "scatter", mode: "markers", name: "actions", x: this.actions.map((a) => localTime(a.time)),
        y: this.actions.map((a) => a.risk ?? null), hovertext: this.actions.map(describeAction),
        hovertemplate: "%{hovertext}<extra></extra>", marker: { symbol: "diamond-open", size: 11, color: "#8250df", line: { width: 2 } },
      });
    }
    const layout = withReferences(
      chartLayout({ xTitle: "time", yTitle: "risk", uirevision: `risk-${this.page.id}`, height: 240, hovermode: "closest" }),
      referenceLine(WARN_RISK, `medium ${WARN_RISK}`, "#9a6700"), referenceLine(ACT_RISK, `high ${ACT_RISK}`, "#cf222e"));
    layout.yaxis = { ...layout.yaxis, range: [0, 1.05], rangemode: undefined };
    layout.xaxis = { ...layout.xaxis, type: "date" };
    reactWhenSeen(div, traces, layout, PLOT_CONFIG);
  }

  // per node: CPU util and memory used (%, left), each rank's median step time (s, right), and the metric
  // chosen in the menu (its own axis); below, the sources the node cannot read and why
  renderTelemetry() {
    const box = this.el("telemetry-nodes");
    const nodes = [...this.telemetry.entries()].sort((a, b) => (a[1].node_rank ?? 1e9) - (b[1].node_rank ?? 1e9) || a[0].localeCompare(b[0]));
    this.el("telemetry-empty").hidden = nodes.length > 0;
    this.renderMetricMenu();
    for (const [node, n] of nodes) {
      let card = box.querySelector(`.telemetry-node[data-node="${CSS.escape(node)}"]`);
      if (!card) {
        card = h("div", { class: "telemetry-node", dataset: { node } },
          h("h3", {}, node, h("span", { class: "muted small-inline" })), h("div", { class: "chart" }),
          h("p", { class: "muted small" }, "Sources this node cannot read:"), h("ul", { class: "absent-sources compact" }));
        box.append(card);
      }
      const last = n.samples[n.samples.length - 1];
      card.dataset.samples = n.samples.length;
      card.querySelector("h3 span").textContent = ` node ${n.node_rank ?? "?"} · ${formatNumber(n.samples.length)} sample(s)` +
        (n.cost ? ` · every ${formatSeconds(n.cost.interval_s)}, ${formatSeconds(n.cost.cpu_s)} CPU each` : "") +
        (last && last.t ? ` · last ${last.t.slice(11, 19)}` : "");
      this.drawTelemetryChart(card.querySelector(".chart"), node, n);
      const absent = Object.entries(n.absent || {});
      card.querySelector("p").textContent = n.absent == null ? "Sources this node cannot read: not reported yet."
        : absent.length ? "Sources this node cannot read:" : "Every telemetry source answered on this node.";
      card.querySelector("ul.absent-sources").replaceChildren(...absent.map(([source, why]) =>
        h("li", { dataset: { source } }, h("code", {}, source), `: ${why}`)));
    }
  }

  renderMetricMenu() {
    const select = this.el("telemetry-extra");
    const fixed = (k) => k === CPU_UTIL || k === MEM_USED || RANK_STEP_P50.test(k);
    if (!select.dataset.bound) {
      select.dataset.bound = "1";
      select.addEventListener("change", () => { this.extra = select.value; this.renderTelemetry(); });
    }
    const keys = [...this.metricKeys].filter((k) => !fixed(k)).sort();
    if (select.options.length - 1 === keys.length) return;  // (metrics are only ever added)
    select.replaceChildren(h("option", { value: "" }, "nothing more"), ...keys.map((k) => h("option", { value: k }, k)));
    select.value = this.extra;
  }

  drawTelemetryChart(div, node, n) {
    const x = n.samples.map((s) => s.t);
    const series = (key) => n.samples.map((s) => s.metrics[key] ?? null);
    const line = (name, key, color, extra = {}) => ({
      type: "scatter", mode: "lines", name, meta: key, x, y: series(key), line: { color, width: 2 }, connectgaps: false, ...extra,
    });
    const traces = [line("CPU util %", CPU_UTIL, COLORS[0]), line("memory used %", MEM_USED, COLORS[1])];
    const ranks = new Set();
    for (const s of n.samples) for (const k of Object.keys(s.metrics)) { const m = k.match(RANK_STEP_P50); if (m) ranks.add(Number(m[1])); }
    [...ranks].sort((a, b) => a - b).forEach((r, i) => traces.push(line(`rank ${r} step p50 (s)`, `job.rank${r}.step_time_p50_s`,
      COLORS[(2 + i) % COLORS.length], { yaxis: "y2", line: { color: COLORS[(2 + i) % COLORS.length], width: 1.5, dash: "dot" } })));
    const layout = chartLayout({ xTitle: "time", yTitle: "%", uirevision: `telemetry-${this.page.id}-${node}`, height: 260 });
    layout.xaxis = { ...layout.xaxis, type: "date", domain: [0, this.extra ? 0.86 : 1] };
    layout.yaxis2 = { title: { text: "step time p50 (s)" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false };
    layout.margin = { ...layout.margin, r: this.extra ? 72 : 56 };
    if (this.extra) {
      traces.push(line(this.extra, this.extra, "#57606a", { yaxis: "y3" }));
      layout.yaxis3 = { title: { text: unitOf(this.extra) || this.extra }, overlaying: "y", side: "right", anchor: "free",
                        position: 1, rangemode: "tozero", showgrid: false };
    }
    reactWhenSeen(div, traces, layout, PLOT_CONFIG);
  }
}

// ------------------------------------------------------------------------------------- dashboard

const RELOAD_MS = 5000;  // a job's API record is read again at most this often (while its protection is unknown)

// The risk badges of the dashboard's running jobs: each job's `risk` from its API record (GET /api/jobs/<id>/),
// then its live risk events (each node's newest score) on the streams the dashboard follows anyway.
// onChange(id): a job's badge changed.
export class LiveRiskBadges {
  constructor({ onChange = () => {} } = {}) {
    this.onChange = onChange;
    this.jobs = new Map();  // id -> {attempt, protected, nodes: Map(node -> {risk, at}), loading, loadedAt, known}
  }

  stateOf(id) {
    if (!this.jobs.has(id)) this.jobs.set(id, { attempt: 0, protected: null, nodes: new Map(), loading: false, loadedAt: 0, known: false });
    return this.jobs.get(id);
  }

  // a row of the table: a running job's risk is read once from the API
  track(row) {
    if (!SCORED_STATES.has(row.state)) return;
    const s = this.stateOf(row.id);
    if (!s.known) this.load(row.id);
  }

  // the risk a row's badge shows while the job runs (setJobBadge): null before its first score
  badgeOf(row) {
    const s = this.jobs.get(row.id);
    return s ? jobRisk([...s.nodes.values()], s.protected) : null;
  }

  async load(id) {
    const s = this.stateOf(id);
    if (s.loading || Date.now() - s.loadedAt < RELOAD_MS) return;
    s.loading = true;
    const r = await getJSON(`/api/jobs/${id}/`);
    s.loading = false;
    s.loadedAt = Date.now();
    if (!r.ok) return;
    s.known = true;
    const risk = r.body.risk;
    if (!risk) { this.onChange(id); return; }
    s.protected = risk.protected;
    this.atAttempt(s, r.body.attempts || 1);
    for (const n of risk.nodes || []) this.setNode(s, n.node, n.risk, n.at);
    this.onChange(id);
  }

  atAttempt(s, attempt) {
    if (attempt > s.attempt) { s.attempt = attempt; s.nodes.clear(); }
    return attempt === s.attempt;
  }

  setNode(s, node, risk, at) {
    const known = s.nodes.get(node);
    if (known && Date.parse(known.at) > Date.parse(at)) return;  // the API record and the stream may cross
    s.nodes.set(node, { risk: risk ?? null, at });
  }

  // a live event of a followed job stream (any kind: only risk events count)
  onEvent(e) {
    if (e.kind !== "risk" || (e.values || {}).action) return;  // (an action's event carries no scores)
    const id = Number(e.stream.split("/")[1]);
    const v = e.values || {};
    const s = this.stateOf(id);
    if (!this.atAttempt(s, v.attempt || 1)) return;
    this.setNode(s, String(v.node), v.risk, e.time);
    if (s.protected == null) this.load(id);  // whether it takes snapshots is in its API record
    this.onChange(id);
  }
}
