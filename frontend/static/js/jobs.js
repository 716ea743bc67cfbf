// The job pages: detail (history then live charts, one trace per attempt, the live log) and compare (the
// job list is job_list.js). History comes first (rendered into the page, then paged from the events API
// when long), then the websocket subscription resumes from the last history seq: no point is drawn twice
// or missed. Elastic recovery: faults are markers on the loss chart (hover: kind, RTO, steps lost), the
// snapshots table restores the job from one, the goodput panel splits the wall time; the page starts from
// the rows the server rendered and live `fault` / `recovery` / `snapshot` / `goodput` events update them.
// Fault risk: `telemetry` and `risk` events feed the fault-risk and node-telemetry panels (risk.js).
import { LiveClient } from "./live.js";
import { FaultRiskPanel } from "./risk.js";
import {
  COLORS, Ema, FAULT_AXIS, PLOT_CONFIG, TraceAppender, chartLayout, faultShapes, faultTrace, referenceLine,
  withReferences,
} from "./charts.js";
import {
  failureLines, formatBytes, formatGiB, formatNumber, formatPercent, formatSeconds, formatVsPredicted, getJSON,
  postJSON,
} from "./common.js";

const JOB_STATES = new Set(["scheduled", "queued", "launching", "running", "recovering", "succeeded", "failed", "cancelled"]);
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const EVENTS_PAGE = 5000;   // the events API returns at most this many per call
const STEADY_WINDOW = 10;   // steps averaged into the live "measured" figures

function setStatePill(el, state) {
  el.textContent = state;
  el.dataset.state = state;
  el.className = `state ${state}`;
}

// ---------------------------------------------------------------------------------------- job detail

const LOG_MAX_LINES = 2000;  // lines the log panel keeps (the node's log file on the worker has them all)
// traces each attempt has on each chart of the job page: loss raw + smoothed, tokens/s, memory, and the
// four stacked parts of the step time; attempt slot k owns traces k*n .. k*n+n-1 of a chart
const TRACES_PER_ATTEMPT = { loss: 2, tokens: 1, memory: 1, step: 4 };
const STEP_PARTS = [["compute", 1], ["exposed comm", 0], ["pipeline bubble", 3], ["other / not profiled", null]];
const STEP_PATTERNS = ["", "/", "x", ".", "+", "\\"];

// Which attempt (launch) of a job an event belongs to. Events say it (`attempt`); older ones belong to the
// launch before them: each "queued" event starts one (its own `attempt`, else the next number). Events
// from before any launch are attempt 1.
export class AttemptTracker {
  constructor() { this.current = 0; }

  of(e) {
    const v = e.values || {};
    if (e.kind === "event" && v.state === "queued") this.current = v.attempt || this.current + 1;
    else if (v.attempt) this.current = Math.max(this.current, v.attempt);
    return v.attempt || this.current || 1;
  }
}

// The chart series of one attempt, built from its train events. A step that does not increase within an
// attempt (a restart from a snapshot) starts a new segment: a null point breaks the lines there.
class AttemptSeries {
  constructor(attempt, slot, smoothing) {
    this.attempt = attempt;
    this.slot = slot;
    this.ema = new Ema(smoothing);
    this.lastStep = null;
    this.count = 0;
    this.recent = [];   // the latest steady steps: {step_time_s, tokens_per_s}
  }

  // -> list of [chart, trace of this attempt, x, y] points to append
  points(e) {
    const v = e.values || {};
    const out = [];
    const x = e.step;
    if (this.lastStep !== null && x <= this.lastStep) {
      for (const [chart, n] of Object.entries(TRACES_PER_ATTEMPT)) {
        if (chart === "step") continue;
        for (let t = 0; t < n; t++) out.push([chart, t, null, null]);
      }
      this.ema.reset();
      this.recent = [];
    }
    const first = this.lastStep === null || x <= this.lastStep;
    this.lastStep = x;
    this.count += 1;
    out.push(["loss", 0, x, v.loss ?? null]);
    out.push(["loss", 1, x, this.ema.push(v.loss ?? null)]);
    // a profiled step runs under the profiler, several times slower: left out of the throughput line and
    // of the step-time split (it would flatten every other bar), as the run summary leaves it out
    if (!v.profiled) out.push(["tokens", 0, x, v.tokens_per_s ?? null]);
    out.push(["memory", 0, x, v.memory_GiB ?? null]);
    if (v.profiled) {
      for (const t of [0, 1, 2, 3]) out.push(["step", t, x, null]);
    } else {
      // step-time split, stacked: bubble from the schedule, compute and exposed comm from the latest
      // profiled step, the rest unattributed (optimizer, data, launch)
      const total = v.step_time_s ?? 0;
      const bubble = total * (v.bubble_fraction ?? 0);
      let left = Math.max(total - bubble, 0);
      const compute = v.compute_s != null ? Math.min(v.compute_s, left) : 0;
      left -= compute;
      const comm = (v.exposed_comm_s ?? v.comm_s) != null ? Math.min(v.exposed_comm_s ?? v.comm_s, left) : 0;
      left -= comm;
      out.push(["step", 0, x, compute], ["step", 1, x, comm], ["step", 2, x, bubble], ["step", 3, x, left]);
    }
    if (!first && !v.profiled && v.step_time_s) {
      this.recent.push({ step_time_s: v.step_time_s, tokens_per_s: v.tokens_per_s });
      if (this.recent.length > STEADY_WINDOW) this.recent.shift();
    }
    return out;
  }

  steady(key) {
    if (!this.recent.length) return null;
    return this.recent.reduce((a, r) => a + (r[key] || 0), 0) / this.recent.length;
  }
}

// The series of every attempt of a job, and what the figures table and the expert chart show.
class JobSeries {
  constructor(smoothing) {
    this.smoothing = smoothing;
    this.tracker = new AttemptTracker();
    this.attempts = new Map();   // attempt -> AttemptSeries, in the order they appeared (= trace slots)
    this.memory = null;
    this.overlap = null;  // the latest measured overlap ratio and where it came from
    this.expertLoad = null;
    this.expertImbalance = null;
  }

  // the series of an attempt; `created` says a new one was opened (its traces still have to be added)
  attempt(n) {
    let s = this.attempts.get(n);
    const created = !s;
    if (created) {
      s = new AttemptSeries(n, this.attempts.size, this.smoothing);
      this.attempts.set(n, s);
    }
    return { series: s, created };
  }

  get latest() {
    let best = null;
    for (const s of this.attempts.values()) if (!best || s.attempt > best.attempt) best = s;
    return best;
  }

  get points() { let n = 0; for (const s of this.attempts.values()) n += s.count; return n; }

  steady(key) { return this.latest ? this.latest.steady(key) : null; }

  note(v) {
    if (v.memory_GiB != null) this.memory = v.memory_GiB;
    if (v.overlap_ratio != null) this.overlap = { ratio: v.overlap_ratio, profiled: true, source: "the latest profiled step, every collective" };
    else if (v.comm_s_total > 0 && v.comm_s_exposed != null && !(this.overlap && this.overlap.profiled)) {
      this.overlap = { ratio: Math.max(0, 1 - Math.min(v.comm_s_exposed, v.comm_s_total) / v.comm_s_total),
                       source: "the latest step's comm hook timing, data-parallel buckets only" };
    }
    if (Array.isArray(v.expert_load)) {
      this.expertLoad = v.expert_load;
      this.expertImbalance = v.expert_imbalance;
    }
  }
}

// "8 s", "3 min", "2 h"
function ago(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  return s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${Math.round(s / 3600)} h`;
}

class JobDetail {
  constructor(page) {
    this.page = page;
    this.state = page.state;
    this.measured = null;  // the run summary of the latest attempt, once it finished
    // the job list's figures of this job (the same selector): what a stopped job shows as measured
    this.row = TERMINAL.has(page.state) ? page.figures || null : null;
    this.predicted = page.plan_predicted || {};
    this.lastSeq = 0;
    this.el = (id) => document.getElementById(id);
    this.smoothing = Number(this.el("loss-smoothing").value);
    this.series = new JobSeries(this.smoothing);
    this.launchedAt = Date.parse(page.created_at) || Date.now();
    this.log = { lines: [], attempt: null, started: false };
    this.charts = {};
    // elastic recovery: the rows the server rendered, updated by live events (keyed: a repeat replaces)
    this.faults = new Map((page.faults || []).map((f) => [f.id, f]));
    this.snapshots = new Map((page.snapshots || []).map((x) => [x.name, x]));
    this.goodput = page.goodput || null;
    // (the page's attempt count: its queued event may not be stored yet)
    this.risk = new FaultRiskPanel(page, () => Math.max(1, page.attempts || 0, this.series.tracker.current));
  }

  async start() {
    let history = this.page.history;
    let complete = this.page.history_complete;
    const all = [...history];
    while (!complete) {  // a long run: page on through the stored history before going live
      const after = all.length ? all[all.length - 1].seq : 0;
      const r = await getJSON(`${this.page.api}events/?after_seq=${after}`);
      history = r.ok ? r.body : [];
      all.push(...history);
      complete = history.length < EVENTS_PAGE;
    }
    const data = { loss: [], tokens: [], memory: [], step: [] };  // per chart: per trace, [x, y] points
    const pointsOf = (chart, series, t) => {
      const i = series.slot * TRACES_PER_ATTEMPT[chart] + t;
      while (data[chart].length <= i) data[chart].push([]);
      return data[chart][i];
    };
    for (const e of all) {
      this.lastSeq = Math.max(this.lastSeq, e.seq);
      const attempt = this.series.tracker.of(e);
      if (e.kind === "train") {
        const { series } = this.series.attempt(attempt);
        for (const [chart, t, x, y] of series.points(e)) pointsOf(chart, series, t).push([x, y]);
        this.series.note(e.values || {});
      } else if (e.kind === "event") {
        this.event(e, attempt, { live: false });
      } else if (e.kind === "energy") {
        this.energyEvent(e, attempt);
      } else if (e.kind === "telemetry" || e.kind === "risk") {
        this.risk.note(e, attempt);
      }
    }
    // the current attempt has its traces (empty until its first step) so a page always has attempt lines
    this.series.attempt(Math.max(1, this.page.attempts || 0, this.series.tracker.current));
    // the page's state is the database's; history may lag it by a relay batch, never lead it
    if (!this.measured && this.page.state === "succeeded" && this.page.measured) this.measured = this.page.measured;
    this.plot(data);
    this.figures();
    this.waiting();
    this.renderFaults();
    this.renderSnapshots();
    this.renderGoodput();
    this.renderEnergy();
    this.risk.render();
    const log = this.el("job-log");
    log.scrollTop = log.scrollHeight;
    this.bindButtons();
    this.client = new LiveClient({
      onStatus: (s) => { const el = this.el("live-status"); el.textContent = s; el.dataset.state = s; },
      onEvent: (e) => this.live(e),
      onError: (m) => this.showActionError(m.message),
      onSubscribed: (m) => { document.body.dataset.subscribed = m.last_seq; },
    });
    this.client.subscribe(this.page.stream, this.lastSeq);
    return this;
  }

  // the Plotly traces of one attempt on one chart, filled with `pts[t]` ([x, y] points of its trace t)
  tracesOf(chart, series, pts = []) {
    const n = series.attempt;
    const group = `attempt-${n}`;
    const xs = (t) => (pts[t] || []).map((p) => p[0]);
    const ys = (t) => (pts[t] || []).map((p) => p[1]);
    const line = (name, t, color, extra = {}) => ({
      type: "scatter", mode: "lines", name, x: xs(t), y: ys(t), line: { color, width: 2 }, connectgaps: false,
      legendgroup: group, ...extra,
    });
    const color = (base) => COLORS[(base + series.slot) % COLORS.length];
    if (chart === "loss") {
      return [
        line(`attempt ${n} (raw)`, 0, `${color(0)}48`, { mode: "lines+markers", marker: { size: 3 }, showlegend: false }),
        line(`attempt ${n}`, 1, color(0)),
      ];
    }
    if (chart === "tokens") return [line(`attempt ${n}`, 0, color(1))];
    if (chart === "memory") return [line(`attempt ${n}`, 0, color(2))];
    return STEP_PARTS.map(([name, c], t) => ({
      type: "bar", name, x: xs(t), y: ys(t), legendgroup: group, legendgrouptitle: { text: `attempt ${n}` },
      offsetgroup: group,
      marker: { color: c == null ? "#afb8c1" : COLORS[c], pattern: { shape: STEP_PATTERNS[series.slot % STEP_PATTERNS.length] } },
    }));
  }

  plot(data) {
    const uirevision = `job-${this.page.id}`;
    const p = this.predicted;
    const attempts = [...this.series.attempts.values()];
    const traces = (chart) => attempts.flatMap((s) => {
      const n = TRACES_PER_ATTEMPT[chart];
      return this.tracesOf(chart, s, data[chart].slice(s.slot * n, s.slot * n + n));
    });
    this.charts.loss = this.el("chart-loss");
    // the fault markers' trace (once there is a fault) comes after every attempt's two loss traces
    const faults = [...this.faults.values()];
    this.faultTrace = faults.length > 0;
    Plotly.newPlot(this.charts.loss, [...traces("loss"), ...(this.faultTrace ? [faultTrace(faults, describeFault)] : [])],
      { ...chartLayout({ yTitle: "loss", uirevision }), ...FAULT_AXIS, shapes: faultShapes(faults) }, PLOT_CONFIG);

    this.charts.tokens = this.el("chart-tokens");
    Plotly.newPlot(this.charts.tokens, traces("tokens"),
      withReferences(chartLayout({ yTitle: "tokens/s", uirevision }),
        p.tokens_per_s != null && referenceLine(p.tokens_per_s, `predicted ${formatNumber(p.tokens_per_s)} tokens/s`)),
      PLOT_CONFIG);

    this.charts.step = this.el("chart-step");
    Plotly.newPlot(this.charts.step, traces("step"),
      withReferences(chartLayout({ yTitle: "seconds", uirevision, barmode: "stack", bargap: 0.1 }),
        p.step_time_s != null && referenceLine(p.step_time_s, `predicted ${formatSeconds(p.step_time_s)}`, "#1d2430")),
      PLOT_CONFIG);

    this.charts.memory = this.el("chart-memory");
    const predictedMemory = (p.memory_GiB_per_device || {}).total;
    Plotly.newPlot(this.charts.memory, traces("memory"),
      withReferences(chartLayout({ yTitle: "GiB", uirevision }),
        predictedMemory != null && referenceLine(predictedMemory, `predicted ${formatGiB(predictedMemory, 2)}`)),
      PLOT_CONFIG);

    this.charts.experts = this.el("chart-experts");
    if (this.charts.experts) {
      const load = this.series.expertLoad || [];
      Plotly.newPlot(this.charts.experts, [{
        type: "bar", name: "share of routed tokens", x: load.map((_, i) => `expert ${i}`), y: load, marker: { color: COLORS[4] },
      }], withReferences(chartLayout({ xTitle: "expert", yTitle: "share of tokens", uirevision }),
        load.length && referenceLine(1 / load.length, "balanced")), PLOT_CONFIG);
    }

    this.appenders = {};
    for (const name of Object.keys(TRACES_PER_ATTEMPT)) {
      this.appenders[name] = new TraceAppender(this.charts[name]);
    }
    this.el("loss-smoothing").addEventListener("input", (ev) => this.resmooth(Number(ev.target.value)));
    this.el("loss-smoothing-value").textContent = formatNumber(this.smoothing, 2);
  }

  // a new attempt during the page's life: its traces go after the others' (their indices stay)
  addAttemptTraces(series) {
    for (const chart of Object.keys(TRACES_PER_ATTEMPT)) {
      this.appenders[chart].flush();
      if (chart === "loss" && this.faultTrace) {  // before the fault markers: attempts keep 2*slot, 2*slot+1
        const at = 2 * series.slot;
        Plotly.addTraces(this.charts.loss, this.tracesOf(chart, series), [at, at + 1]);
      } else {
        Plotly.addTraces(this.charts[chart], this.tracesOf(chart, series));
      }
    }
  }

  // ------------------------------------------------------------------------------ elastic recovery

  // the fault markers on the loss chart (their trace is the last one) and the faults table
  renderFaults() {
    const faults = [...this.faults.values()].sort((a, b) => (a.detected_at || "").localeCompare(b.detected_at || "") || a.id - b.id);
    const div = this.charts.loss;
    if (div && div.data && faults.length) {
      const t = faultTrace(faults, describeFault);
      this.appenders.loss.flush();
      if (!this.faultTrace) {
        Plotly.addTraces(div, t);
        this.faultTrace = true;
      } else {
        Plotly.restyle(div, { x: [t.x], y: [t.y], text: [t.text], hovertext: [t.hovertext], showlegend: [t.showlegend] },
          [div.data.length - 1]);
      }
      Plotly.relayout(div, { shapes: faultShapes(faults) });
    }
    const body = this.el("fault-table").tBodies[0];
    body.replaceChildren(...faults.map((f) => {
      const tr = document.createElement("tr");
      tr.dataset.fault = f.id;
      tr.dataset.kind = f.kind;
      tr.dataset.recovered = f.recovered_at ? "yes" : "no";
      const cells = [
        [f.attempt + (f.restart ? ` · restart ${f.restart}` : ""), ""],
        [f.kind + (f.node_name ? ` (${f.node_name})` : ""), ""],
        [f.rank ?? "—", "num"],
        [f.step ?? "—", "num"],
        [f.recovered_at ? (f.resumed_from_step ?? "—") + (f.snapshot ? ` (${f.snapshot})` : "") : "recovering…", ""],
        [f.steps_lost ?? "—", "num"],
        [f.rto_s != null ? formatSeconds(f.rto_s) : "—", "num"],
      ];
      for (const [text, cls] of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      }
      tr.title = f.message || "";
      return tr;
    }));
    this.el("faults-empty").hidden = faults.length > 0;
  }

  // the snapshots table, newest first, each with its "Restore from this snapshot" button
  renderSnapshots() {
    const rows = [...this.snapshots.values()].sort((a, b) => b.step - a.step || b.name.localeCompare(a.name));
    const body = this.el("snapshot-table").tBodies[0];
    const ended = TERMINAL.has(this.state);
    body.replaceChildren(...rows.map((x) => {
      const tr = document.createElement("tr");
      tr.dataset.snapshot = x.name;
      const td = (text, cls = "") => {
        const el = document.createElement("td");
        el.textContent = text;
        if (cls) el.className = cls;
        return el;
      };
      const ratio = x.raw_bytes && x.bytes_written ? ` (${formatNumber(x.raw_bytes / x.bytes_written, 2)}× smaller than raw)` : "";
      const verified = td(x.verified ? "yes" : "no", x.verified ? "ok" : "bad");
      if (x.problem) verified.title = x.problem;
      const disk = x.on_disk == null ? "—" : x.on_disk;
      const when = x.created_at ? new Date(x.created_at).toLocaleTimeString([], { hour12: false }) : "—";
      const action = document.createElement("td");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "restore-button";
      button.dataset.snapshot = x.name;
      button.textContent = "Restore from this snapshot";
      const restorable = x.restorable !== false && x.verified;
      button.disabled = !ended || !restorable;
      button.title = !restorable ? "this snapshot cannot be restored (not verified, or no longer on disk)"
        : !ended ? "cancel the job (or let it end) first" : `a new attempt continues from step ${x.step}`;
      action.append(button);
      tr.append(td(x.name), td(x.step, "num"), td(x.kind), td(formatBytes(x.bytes_written) + ratio, "num"), verified,
        td(disk), td(when), action);
      return tr;
    }));
    this.el("snapshots-empty").hidden = rows.length > 0;
  }

  // goodput %: productive training time over wall time, and each part of the badput in seconds
  renderGoodput() {
    const g = this.goodput;
    const value = this.el("goodput-value");
    value.textContent = g ? formatPercent(g.goodput, 1) : "—";
    if (g && g.goodput != null) value.dataset.value = g.goodput; else delete value.dataset.value;
    this.el("goodput-detail").textContent = g
      ? `${formatSeconds(g.productive_s)} productive of ${formatSeconds(g.wall_s)} wall time` +
        (g.attempt ? ` · attempt ${g.attempt}` : "") + (g.restarts ? ` · ${g.restarts} restart(s)` : "")
      : "";
    const body = this.el("badput-table").tBodies[0];
    const badput = (g && g.badput) || {};
    body.replaceChildren(...Object.keys(badput).map((key) => {
      const tr = document.createElement("tr");
      tr.dataset.badput = key;
      const name = document.createElement("th");
      name.textContent = BADPUT_LABELS[key] || key.replace(/_s$/, "").replaceAll("_", " ");
      const seconds = document.createElement("td");
      seconds.className = "num";
      seconds.textContent = formatSeconds(badput[key]);
      seconds.dataset.value = badput[key];
      tr.append(name, seconds);
      return tr;
    }));
    this.el("goodput-empty").hidden = !!g;
  }

  // a fault, a recovery, a snapshot or the goodput reported while the page is open
  elastic(v) {
    if (v.fault || v.recovery) {
      const f = v.recovery || v.fault;
      // a fault event after its recovery (the relay may store them out of order) does not undo it
      const known = this.faults.get(f.id);
      if (!(v.fault && known && known.recovered_at)) this.faults.set(f.id, f);
      this.renderFaults();
    }
    if (v.snapshot) {
      const x = v.snapshot;
      const where = x.removed ? "removed" : "present";
      this.snapshots.set(x.name, { ...(this.snapshots.get(x.name) || {}), ...x, on_disk: where, restorable: x.verified && !x.removed });
      this.renderSnapshots();
    }
    if (v.goodput) {
      this.goodput = v.goodput;
      this.renderGoodput();
    }
  }

  resmooth(weight) {
    this.appenders.loss.flush();
    this.smoothing = this.series.smoothing = weight;
    this.el("loss-smoothing-value").textContent = formatNumber(weight, 2);
    const xs = [], ys = [], indices = [];
    for (const s of this.series.attempts.values()) {
      const raw = this.charts.loss.data[2 * s.slot];
      s.ema = new Ema(weight);
      const smoothed = raw.y.map((y) => s.ema.push(y));
      xs.push(raw.x.slice()); ys.push(smoothed); indices.push(2 * s.slot + 1);
    }
    Plotly.restyle(this.charts.loss, { x: xs, y: ys }, indices);
  }

  live(e) {
    this.lastSeq = e.seq;
    const attempt = this.series.tracker.of(e);
    if (e.kind === "train") {
      const { series, created } = this.series.attempt(attempt);
      if (created) this.addAttemptTraces(series);
      const base = (chart) => series.slot * TRACES_PER_ATTEMPT[chart];
      for (const [chart, t, x, y] of series.points(e)) this.appenders[chart].push(base(chart) + t, x, y);
      this.series.note(e.values || {});
      if (this.charts.experts && this.series.expertLoad) this.updateExperts();
      // (a recovering job is running again once its recovery is reported, not at the first step after it)
      if (this.state !== "running" && this.state !== "recovering" && !TERMINAL.has(this.state)) this.setState("running");
      this.figures();
      this.waiting();
    } else if (e.kind === "event") {
      this.event(e, attempt, { live: true });
    } else if (e.kind === "energy") {
      this.energyEvent(e, attempt);
      this.renderEnergy();
    } else if (e.kind === "telemetry" || e.kind === "risk") {
      this.risk.note(e, attempt);
      this.risk.render();
    }
  }

  // an "energy" event: the attempt's running totals since its start (workers/green/job.py); the job's are
  // the sum over attempts, as the API's (controlplane/green/selectors.py)
  energyEvent(e, attempt) {
    this.energy = this.energy || { last: new Map(), points: [] };
    const v = e.values || {};
    this.energy.last.set(v.attempt || attempt, v);
    const t = this.energyTotals();
    this.energy.points.push({ step: e.step, kwh: t.kwh, kgco2e: t.kgco2e, watts: v.watts });
  }

  energyTotals() {
    const attempts = [...this.energy.last.keys()].sort((a, b) => a - b).map((a) => this.energy.last.get(a));
    const sum = (key) => (attempts.some((v) => v[key] == null) ? null : attempts.reduce((s, v) => s + v[key], 0));
    const latest = attempts[attempts.length - 1];
    const kwhIt = sum("kwh_it"), tokens = sum("tokens");
    return {
      latest, kwh: sum("kwh"), kwh_it: kwhIt, kgco2e: sum("kgco2e"), kgco2e_market: sum("kgco2e_market"),
      cost: sum("cost"), tokens, tokens_per_kwh: kwhIt && tokens != null ? tokens / kwhIt : null,
    };
  }

  renderEnergy() {
    const empty = !this.energy || !this.energy.last.size;
    this.el("energy-empty").hidden = !empty;
    if (empty) return;
    const t = this.energyTotals();
    const v = t.latest;
    const set = (id, text, value) => {
      const el = this.el(id);
      el.textContent = text;
      if (value != null) el.dataset.value = value; else delete el.dataset.value;
    };
    const kwh = (x) => (x == null ? "—" : x < 0.01 ? `${formatNumber(x * 1000, 3)} Wh` : `${formatNumber(x, 3)} kWh`);
    const kg = (x) => (x == null ? "—" : x < 0.01 ? `${formatNumber(x * 1000, 3)} gCO2e` : `${formatNumber(x, 3)} kgCO2e`);
    set("energy-kwh", kwh(t.kwh), t.kwh);
    set("energy-kwh-it", kwh(t.kwh_it), t.kwh_it);
    set("energy-watts", v.watts == null ? "—" : `${formatNumber(v.watts, 1)} W`, v.watts);
    set("energy-kgco2e", kg(t.kgco2e), t.kgco2e);
    set("energy-kgco2e-market", t.kgco2e_market == null ? "— (no contractual factor)" : kg(t.kgco2e_market), t.kgco2e_market);
    const i = v.intensity;
    set("energy-intensity", i ? `${formatNumber(i.g_per_kwh ?? i.value, 1)} g/kWh · ${i.provider} ${i.zone} · ${i.kind}` +
      (i.kind === "history" ? " (measured history used as a stand-in)" : "") : (v.carbon_note || "—"), i ? (i.g_per_kwh ?? i.value) : null);
    set("energy-tokens-per-kwh", t.tokens_per_kwh == null ? "—" : formatNumber(t.tokens_per_kwh, 0), t.tokens_per_kwh);
    set("energy-sci", v.sci_g_per_1m_tokens == null ? "—" : `${formatNumber(v.sci_g_per_1m_tokens, 2)} gCO2e`, v.sci_g_per_1m_tokens);
    set("energy-cost", t.cost == null ? "— (no price set)" : `${formatNumber(t.cost, 4)} ${v.currency || ""}`, t.cost);
    set("energy-pue", v.pue == null ? "—" : formatNumber(v.pue, 2), v.pue);
    const method = this.el("energy-method");
    method.hidden = false;
    method.textContent = v.measured ? `measured (${v.method})` : "estimate";
    method.dataset.method = v.method;
    const caveat = this.el("energy-estimate");
    caveat.hidden = !!v.measured;
    caveat.textContent = v.measured ? "" : `Estimated, not measured: ${v.label || "no power meter on this machine"}` +
      (v.estimated && v.estimated.length ? ` (${v.estimated.join(", ")})` : "") + ".";
    this.el("energy-note").textContent = [v.carbon_note, this.energy.last.size > 1 ? `summed over ${this.energy.last.size} attempts` : ""]
      .filter(Boolean).join(" · ");
    const pts = this.energy.points;
    const traces = [
      { type: "scatter", mode: "lines", name: "energy (kWh)", x: pts.map((p) => p.step), y: pts.map((p) => p.kwh), line: { color: COLORS[0] } },
      { type: "scatter", mode: "lines", name: "carbon (kgCO2e)", x: pts.map((p) => p.step), y: pts.map((p) => p.kgco2e), yaxis: "y2", line: { color: COLORS[2] } },
    ];
    const layout = chartLayout({ xTitle: "step", yTitle: "kWh" });
    layout.yaxis2 = { title: { text: "kgCO2e" }, overlaying: "y", side: "right", rangemode: "tozero" };
    layout.margin = { ...layout.margin, r: 56 };
    Plotly.react(this.el("chart-energy"), traces, layout, PLOT_CONFIG);
  }

  // an "event" event: a log batch, or a lifecycle step (timeline, state, summary)
  event(e, attempt, { live }) {
    const v = e.values || {};
    if (Array.isArray(v.log)) { this.appendLog(v, attempt); return; }
    this.timeline(e);
    // the rows the page was rendered with already hold what the stored history says
    if (live && (v.fault || v.recovery || v.snapshot || v.goodput)) this.elastic(v);
    if (v.state === "finished") this.measured = v;  // a "finished" event carries the run summary
    if (v.state === "queued") {  // a new attempt starts without one, from now
      this.measured = null;
      this.launchedAt = Date.parse(e.time) || Date.now();
    }
    if (!live) return;
    if (v.state === "queued") {
      this.row = null;
      const { series, created } = this.series.attempt(attempt);
      if (created) this.addAttemptTraces(series);
      this.risk.render();  // the new attempt's nodes have no score yet
    }
    if (v.state === "finished") this.figures();
    if (JOB_STATES.has(v.state)) {
      this.setState(v.state);
      if (v.state === "queued" && v.attempt) this.el("job-attempts").textContent = v.attempt;
      if (TERMINAL.has(v.state)) this.refresh();
    }
  }

  // new lines of the live log (the node supervisor's batches, noise already left out)
  appendLog(v, attempt) {
    const log = this.el("job-log");
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
    const lines = this.log.lines;
    if (attempt !== this.log.attempt && (this.log.attempt !== null || attempt > 1)) lines.push(`── attempt ${attempt} ──`);
    this.log.attempt = attempt;
    const prefix = this.page.nnodes > 1 ? `[node ${v.node ?? "?"}] ` : "";
    for (const line of v.log) lines.push(prefix + line);
    if (lines.length > LOG_MAX_LINES) lines.splice(0, lines.length - LOG_MAX_LINES);
    this.log.started = true;
    log.textContent = lines.join("\n");
    log.dataset.lines = lines.length;
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  // before the first step the charts say what they wait for, updated every second, instead of bare axes
  waiting() {
    const boxes = document.querySelectorAll(".chart-waiting");
    const waiting = this.series.points === 0;
    let text = "";
    if (waiting) {
      text = TERMINAL.has(this.state) ? "no step was recorded"
        : `waiting for the first step (launched ${ago(Date.now() - this.launchedAt)} ago)`;
    }
    for (const box of boxes) { box.hidden = !waiting; box.textContent = text; }
    if (waiting && !TERMINAL.has(this.state)) {
      if (!this.waitTimer) this.waitTimer = setInterval(() => this.waiting(), 1000);
    } else if (this.waitTimer) {
      clearInterval(this.waitTimer);
      this.waitTimer = null;
    }
  }

  updateExperts() {
    const load = this.series.expertLoad;
    Plotly.restyle(this.charts.experts, { x: [load.map((_, i) => `expert ${i}`)], y: [load] }, [0]);
    if (this.series.expertImbalance != null) {
      this.el("expert-imbalance").textContent = `max/mean ${formatNumber(this.series.expertImbalance, 2)}`;
    }
  }

  setState(state) {
    this.state = state;
    setStatePill(this.el("job-state"), state);
    document.body.dataset.jobState = state;
    // the place in the queue is only known at page load: gone once a worker took the job (or it ended)
    const queued = document.getElementById("queue-position");
    if (queued && state !== "queued" && state !== "launching") queued.hidden = true;
    this.el("cancel-button").hidden = TERMINAL.has(state);
    const relaunchButton = this.el("relaunch-button");
    relaunchButton.hidden = !(state === "failed" || state === "cancelled" || state === "scheduled");
    if (state === "scheduled") relaunchButton.textContent = "Start now";
    else if (relaunchButton.textContent === "Start now") relaunchButton.textContent = "Relaunch";
    this.el("report-button").hidden = state !== "succeeded";
    if (!TERMINAL.has(state)) this.el("cancel-button").disabled = false;
    this.waiting();
    if (this.el("snapshot-table")) this.renderSnapshots();  // restore: only once the job has ended
  }

  // predicted vs measured, side by side; a stopped job shows what the job list shows for it
  figures() {
    const p = this.predicted;
    const row = TERMINAL.has(this.state) && this.row ? this.row : null;
    const m = this.measured && this.measured.step_time_s != null ? this.measured : null;
    const stepTime = row ? row.step_time_s : m ? m.step_time_s : this.series.steady("step_time_s");
    const tokens = row ? row.tokens_per_s : m ? m.tokens_per_s : this.series.steady("tokens_per_s");
    const memory = m && m.memory_GiB != null ? m.memory_GiB : this.series.memory;
    const predictedMemory = (p.memory_GiB_per_device || {}).total;
    const cell = (id, text, value) => {
      const el = this.el(id);
      el.textContent = text;
      if (value != null && Number.isFinite(value)) el.dataset.value = value; else delete el.dataset.value;
    };
    const ratio = (a, b) => (a != null && b ? a / b : null);
    const vs = (id, measured, predicted) => {
      cell(id, formatVsPredicted(measured, predicted), ratio(measured, predicted));
      const r = ratio(measured, predicted);
      this.el(id).classList.toggle("bad", r != null && Math.abs(r - 1) > 0.15);
    };
    cell("predicted-step-time", p.step_time_s != null ? formatSeconds(p.step_time_s) : "no plan", p.step_time_s);
    cell("measured-step-time", formatSeconds(stepTime), stepTime);
    vs("step-time-ratio", stepTime, p.step_time_s);
    cell("predicted-tokens", formatNumber(p.tokens_per_s), p.tokens_per_s);
    cell("measured-tokens", formatNumber(tokens), tokens);
    vs("tokens-ratio", tokens, p.tokens_per_s);
    cell("predicted-memory", formatGiB(predictedMemory, 2), predictedMemory);
    cell("measured-memory", formatGiB(memory, 3), memory);
    vs("memory-ratio", memory, predictedMemory);
    // comm hidden under compute / all comm: the run summary's once it ended, else the latest step's
    const summary = this.measured || this.page.measured || {};
    const overlap = summary.overlap_ratio != null
      ? { ratio: summary.overlap_ratio, source: `the run summary (${summary.overlap_source || "measured"})` }
      : this.series.overlap;
    const predictedOverlap = this.page.predicted_overlap_ratio;
    cell("predicted-overlap", predictedOverlap != null ? formatPercent(predictedOverlap) : "no plan", predictedOverlap);
    cell("measured-overlap", overlap ? formatPercent(overlap.ratio) : "not measured", overlap ? overlap.ratio : null);
    vs("overlap-ratio", overlap ? overlap.ratio : null, predictedOverlap);
    this.el("overlap-note").textContent = overlap
      ? `Comm overlap (communication hidden under compute ÷ all communication) measured from ${overlap.source}` +
        (predictedOverlap != null ? "; predicted by the plan's cost model (TP and EP comm count as exposed)." : ".")
      : "Comm overlap: not measured yet (the runtime measures it on profiled steps: profile_every, or from a comm hook's timing).";
    this.el("measured-note").textContent = row
      ? (row.final ? "Measured: the run summary (steady steps: the first step and profiled steps left out)."
        : `Measured: mean over the last ${STEADY_WINDOW} steady steps before it stopped (the first step and profiled steps left out), as on the job list.`)
      : m ? "Measured: the run summary (steady steps: the first step and profiled steps left out)."
        : `Measured: mean over the latest ${STEADY_WINDOW} steady steps (the first step and profiled steps left out).`;
  }

  timeline(e) {
    const v = e.values || {};
    const li = document.createElement("li");
    li.dataset.seq = e.seq;
    li.dataset.state = v.state || "";
    const when = new Date(e.time);
    const time = document.createElement("time");
    time.dateTime = e.time;
    time.textContent = when.toLocaleTimeString([], { hour12: false });
    const state = document.createElement("span");
    state.className = `state ${v.state || (v.fault ? "failed" : "")}`;
    state.textContent = v.state || (v.fault ? "fault" : v.recovery ? "recovered" : v.snapshot ? "snapshot" : v.goodput ? "goodput" : "event");
    const detail = document.createElement("span");
    detail.className = "detail";
    detail.textContent = describe(v, e.step);
    li.append(time, " ", state, " ", detail);
    this.el("job-events").append(li);
  }

  async refresh() {
    const [r, rows] = await Promise.all([getJSON(this.page.api), getJSON(this.page.rows_api)]);
    if (!r.ok) return;
    const job = r.body;
    if (job.state === "succeeded" && job.measured) this.measured = job.measured;
    const row = rows.ok && Array.isArray(rows.body) ? rows.body.find((x) => x.id === job.id) : null;
    if (row) this.row = { step_time_s: row.measured_step_time_s, tokens_per_s: row.tokens_per_s, final: row.measured_is_final };
    this.setState(job.state);
    this.el("job-attempts").textContent = job.attempts;
    if (!this.log.started) {  // no live log came (an older job): the tail the supervisor stored
      const log = this.el("job-log");
      log.textContent = job.log_tail || "(no log)";
      log.scrollTop = log.scrollHeight;
    }
    this.showJobError(job.state, job.human_readable_error);
    this.faults = new Map((job.faults || []).map((f) => [f.id, f]));
    this.snapshots = new Map((job.snapshots || []).map((x) => [x.name, x]));
    this.goodput = job.goodput || this.goodput;
    this.renderFaults();
    this.renderSnapshots();
    this.renderGoodput();
    this.figures();
  }

  // the job's own message: why it failed (an error), or who cancelled it (a plain note)
  showJobError(state, text) {
    const err = this.el("job-error");
    err.textContent = text || "";
    err.hidden = !text;
    err.className = state === "cancelled" ? "muted" : "error";
  }

  showActionError(text) {
    const el = this.el("action-error");
    el.textContent = text;
    el.hidden = !text;
  }

  bindButtons() {
    const cancel = this.el("cancel-button");
    cancel.addEventListener("click", async () => {
      cancel.disabled = true;
      this.showActionError("");
      const r = await postJSON(`${this.page.api}cancel/`);
      if (!r.ok) { cancel.disabled = false; this.showActionError(failureLines(r, "cancel failed").join(" ")); return; }
      cancel.textContent = TERMINAL.has(r.body.state) ? "Cancel" : "Cancelling…";
      if (TERMINAL.has(r.body.state)) { this.setState(r.body.state); this.refresh(); }
    });
    const relaunch = this.el("relaunch-button");
    relaunch.addEventListener("click", async () => {
      relaunch.disabled = true;
      this.showActionError("");
      const r = await postJSON(`${this.page.api}relaunch/`);
      relaunch.disabled = false;
      if (!r.ok) { this.showActionError(failureLines(r, "relaunch failed").join(" ")); return; }
      cancel.textContent = "Cancel";
      this.measured = null;
      this.row = null;
      this.setState(r.body.state);
      this.el("job-attempts").textContent = r.body.attempts;
      this.el("job-error").hidden = true;
      this.figures();
    });
    // the energy and carbon report: issued on the first click (or the one issued before), then downloaded
    const report = this.el("report-button");
    report.addEventListener("click", async () => {
      report.disabled = true;
      this.showActionError("");
      const r = await postJSON(`${this.page.api}certificate/`);
      report.disabled = false;
      if (!r.ok) { this.showActionError(failureLines(r, "the report could not be issued").join(" ")); return; }
      const code = this.el("report-code");
      code.replaceChildren("code ", Object.assign(document.createElement("code"), { textContent: r.body.code }), " · ",
        Object.assign(document.createElement("a"), { href: r.body.page_url, textContent: "verify" }));
      code.dataset.code = r.body.code;
      report.textContent = "Download the energy and carbon report (PDF)";
      const a = Object.assign(document.createElement("a"), { href: r.body.pdf_url, download: "" });
      document.body.append(a);
      a.click();
      a.remove();
    });
    // "Restore from this snapshot": a new attempt continues from exactly that snapshot
    this.el("snapshot-table").addEventListener("click", async (ev) => {
      const button = ev.target.closest("button.restore-button");
      if (!button || button.disabled) return;
      const name = button.dataset.snapshot;
      const snap = this.snapshots.get(name) || {};
      const ok = window.confirm(`Restore job #${this.page.id} from ${name} (step ${snap.step})? A new attempt ` +
        "continues training from that step; the newer snapshots are set aside.");
      if (!ok) return;
      button.disabled = true;
      this.showActionError("");
      const r = await postJSON(`${this.page.api}restore/`, { snapshot: name });
      if (!r.ok) { button.disabled = false; this.showActionError(failureLines(r, "restore failed").join(" ")); return; }
      cancel.textContent = "Cancel";
      this.measured = null;
      this.row = null;
      this.goodput = null;
      this.setState(r.body.state);
      this.el("job-attempts").textContent = r.body.attempts;
      this.el("job-error").hidden = true;
      this.renderGoodput();
      this.figures();
    });
  }
}

const BADPUT_LABELS = {
  startup_s: "start-up (processes, rendezvous, first step)",
  restore_s: "restore (reading a snapshot)",
  snapshot_stall_s: "snapshot stall (staging)",
  lost_progress_s: "lost progress (steps trained again)",
  fault_wait_s: "fault detection and restart",
  other_s: "other",
};

// The hover text of a fault marker: what happened, and how it was recovered.
function describeFault(f) {
  const what = [f.kind, f.node_name && `node ${f.node_name}`, f.rank != null && `rank ${f.rank}`,
    f.step != null && `after step ${f.step}`,
    `attempt ${f.attempt}`].filter(Boolean).join(" · ");
  const how = f.recovered_at
    ? [f.rto_s != null && `RTO ${formatSeconds(f.rto_s)}`, f.steps_lost != null && `${f.steps_lost} step(s) lost`,
      f.resumed_from_step != null && `resumed from step ${f.resumed_from_step}` + (f.snapshot ? ` (${f.snapshot})` : "")]
      .filter(Boolean).join(" · ")
    : "not recovered (yet)";
  return `${what}<br>${how}`;
}

// One line of the events timeline for an event's values.
function describe(v, step) {
  const attempt = v.attempt ? `attempt ${v.attempt}` : "";
  if (v.recovery) return describeFault(v.recovery).replace("<br>", " — recovered: ");
  if (v.fault) return `${describeFault(v.fault).split("<br>")[0]}` + (v.fault.message ? `: ${v.fault.message}` : "");
  if (v.snapshot) {
    const x = v.snapshot;
    return `snapshot ${x.name} (${x.kind}, ${formatBytes(x.bytes_written)}${x.verified ? ", verified" : ", NOT verified"})`;
  }
  if (v.goodput && !v.state) return `goodput ${formatPercent(v.goodput.goodput, 1)} of ${formatSeconds(v.goodput.wall_s)}`;
  switch (v.state) {
    case "queued": return [attempt, v.message].filter(Boolean).join(" · ");
    case "running": return [attempt, v.nodes && `${v.nodes} node(s)`, v.ranks && `${v.ranks} ranks`].filter(Boolean).join(", ");
    case "launching": return [attempt, v.nodes && `on ${v.nodes.join(", ")}`].filter(Boolean).join(" ");
    case "started": return `${v.world_size} ranks · ${v.strategy} · ${v.device}/${v.backend} · ${v.model} · ${formatNumber(v.params)} params` + (v.start_step ? ` · resumed at step ${v.start_step}` : "");
    case "finished": return `step ${step} · ${formatSeconds(v.step_time_s)}/step · ${formatNumber(v.tokens_per_s)} tokens/s · loss ${formatNumber(v.loss_first, 3)} → ${formatNumber(v.loss_last, 3)}`;
    case "succeeded": case "failed": case "cancelled": {
      const parts = [];
      if (v.message) parts.push(v.message);
      if (v.exit_codes && v.state !== "cancelled") parts.push(`exit codes ${v.exit_codes.join(", ")}`);
      return parts.join(" · ");
    }
    default: return v.message || Object.entries(v).filter(([k]) => k !== "state").map(([k, x]) => `${k}=${typeof x === "object" ? JSON.stringify(x) : x}`).join(" ");
  }
}

export function initJobDetail(page) {
  const detail = new JobDetail(page);
  detail.ready = detail.start();
  return detail;
}

// ------------------------------------------------------------------------------------------- compare

// One line per job and attempt: a relaunch is a line of its own (it starts again at step 1), never joined
// to the attempt before it. Profiled steps are left out of the tokens/s lines (the profiler slows them).
export function initCompare(series) {
  const lossDiv = document.getElementById("compare-loss");
  const tokensDiv = document.getElementById("compare-tokens");
  const lines = [];           // trace index -> {job index, attempt}
  const traceOf = new Map();  // `${stream}#${attempt}` -> trace index
  const attemptsOf = (i) => lines.filter((l) => l.i === i).length;
  const nameOf = (s, attempt, many) => `#${s.id} ${s.name} (${s.strategy})` + (many ? ` · attempt ${attempt}` : "");
  const initial = { loss: [], tokens: [] };
  series.forEach((s, i) => {
    const attempts = [...new Set(s.attempt && s.attempt.length ? s.attempt : [1])].sort((a, b) => a - b);
    for (const attempt of attempts) {
      const at = s.step.map((_, k) => k).filter((k) => ((s.attempt || [])[k] ?? 1) === attempt);
      const trace = (ys, keep = () => true) => {
        const kept = at.filter(keep);
        return {
          type: "scatter", mode: "lines", name: nameOf(s, attempt, attempts.length > 1),
          x: kept.map((k) => s.step[k]), y: kept.map((k) => ys[k]),
          line: { color: COLORS[i % COLORS.length], width: 2, dash: ["solid", "dot", "dash", "dashdot"][(attempt - 1) % 4] },
          connectgaps: false, legendgroup: `job-${s.id}`,
        };
      };
      traceOf.set(`${s.stream}#${attempt}`, lines.length);
      lines.push({ i, attempt });
      initial.loss.push(trace(s.loss));
      initial.tokens.push(trace(s.tokens_per_s, (k) => !(s.profiled || [])[k]));
    }
  });
  Plotly.newPlot(lossDiv, initial.loss, chartLayout({ yTitle: "loss", uirevision: "compare" }), PLOT_CONFIG);
  Plotly.newPlot(tokensDiv, initial.tokens, chartLayout({ yTitle: "tokens/s", uirevision: "compare" }), PLOT_CONFIG);
  const running = series.filter((s) => !s.finished);
  const page = { lossDiv, tokensDiv, series };
  if (!running.length) { document.getElementById("live-status").textContent = "all finished"; return page; }
  const index = new Map(series.map((s, i) => [s.stream, i]));
  const trackers = new Map(series.map((s) => {
    const t = new AttemptTracker();
    t.current = Math.max(s.attempts || 0, ...(s.attempt || []));
    return [s.stream, t];
  }));
  const lastStep = new Map();
  for (const [key, t] of traceOf) {
    const x = initial.loss[t].x;
    lastStep.set(key, x.length ? x[x.length - 1] : null);
  }
  const loss = new TraceAppender(lossDiv);
  const tokens = new TraceAppender(tokensDiv);
  // a new attempt of a job: a line of its own; the job's first line now says which attempt it is
  const addLine = (i, attempt) => {
    const s = series[i];
    loss.flush(); tokens.flush();
    if (attemptsOf(i) === 1) {
      const first = lines.findIndex((l) => l.i === i);
      const name = nameOf(s, lines[first].attempt, true);
      Plotly.restyle(lossDiv, { name }, [first]);
      Plotly.restyle(tokensDiv, { name }, [first]);
    }
    const trace = {
      type: "scatter", mode: "lines", name: nameOf(s, attempt, attemptsOf(i) > 0), x: [], y: [],
      line: { color: COLORS[i % COLORS.length], width: 2, dash: ["solid", "dot", "dash", "dashdot"][(attempt - 1) % 4] },
      connectgaps: false, legendgroup: `job-${s.id}`,
    };
    Plotly.addTraces(lossDiv, trace);
    Plotly.addTraces(tokensDiv, { ...trace });
    traceOf.set(`${s.stream}#${attempt}`, lines.length);
    lines.push({ i, attempt });
    return lines.length - 1;
  };
  page.client = new LiveClient({
    onStatus: (st) => { const el = document.getElementById("live-status"); el.textContent = st; el.dataset.state = st; },
    onEvent: (e) => {
      const i = index.get(e.stream);
      const attempt = trackers.get(e.stream).of(e);
      if (e.kind === "train") {
        const key = `${e.stream}#${attempt}`;
        const t = traceOf.has(key) ? traceOf.get(key) : addLine(i, attempt);
        const prev = lastStep.get(key);
        if (prev != null && e.step <= prev) { loss.push(t, null, null); tokens.push(t, null, null); }
        lastStep.set(key, e.step);
        loss.push(t, e.step, e.values.loss ?? null);
        if (!e.values.profiled) tokens.push(t, e.step, e.values.tokens_per_s ?? null);
      } else if (e.kind === "event" && JOB_STATES.has(e.values?.state)) {
        const pill = document.querySelector(`#compared-jobs tr[data-job="${series[i].id}"] .state`);
        if (pill) setStatePill(pill, e.values.state);
      }
    },
  });
  for (const s of running) page.client.subscribe(s.stream, s.last_seq);
  return page;
}
