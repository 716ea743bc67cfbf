// The job pages: list (compare picks, launch form), detail (history then live charts), compare.
// History comes first (rendered into the page, then paged from the events API when long), then the
// websocket subscription resumes from the last history seq: no point is drawn twice or missed.
import { LiveClient } from "./live.js";
import { COLORS, Ema, PLOT_CONFIG, TraceAppender, chartLayout, referenceLine, withReferences } from "./charts.js";
import {
  failureLines, formatGiB, formatNumber, formatRatio, formatSeconds, getJSON, postJSON, showErrorLines,
} from "./common.js";

const JOB_STATES = new Set(["queued", "launching", "running", "succeeded", "failed", "cancelled"]);
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const EVENTS_PAGE = 5000;   // the events API returns at most this many per call
const STEADY_WINDOW = 10;   // steps averaged into the live "measured" figures

function setStatePill(el, state) {
  el.textContent = state;
  el.dataset.state = state;
  el.className = `state ${state}`;
}

// ------------------------------------------------------------------------------------------ job list

export function initJobList({ maxCompared = 5 } = {}) {
  const picks = [...document.querySelectorAll("#job-table input.pick")];
  const ids = document.getElementById("compare-ids");
  const button = document.getElementById("compare-button");
  const hint = document.getElementById("compare-hint");
  const hintText = hint.textContent;
  const chosen = [];
  for (const box of picks) {
    box.addEventListener("change", () => {
      if (box.checked) {
        if (chosen.length >= maxCompared) {
          box.checked = false;
          hint.textContent = `At most ${maxCompared} jobs on one chart: untick one first.`;
          hint.classList.add("error");
          return;
        }
        chosen.push(box.value);
      } else {
        chosen.splice(chosen.indexOf(box.value), 1);
      }
      hint.textContent = hintText;
      hint.classList.remove("error");
      ids.value = chosen.join(",");
      button.disabled = chosen.length < 1;
    });
  }

  const examples = JSON.parse(document.getElementById("launch-examples").textContent);
  const form = document.getElementById("launch-form");
  const errors = document.getElementById("launch-errors");
  const strategySelect = form.elements.strategy;
  for (const opt of strategySelect.options) {
    const s = examples.strategies[opt.value];
    const world = (s.tp || 1) * (s.pp || 1) * (s.dp || 1) * (s.cp || 1);
    opt.textContent = `${opt.value} (${world} rank${world > 1 ? "s" : ""})`;
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    errors.replaceChildren();
    const f = form.elements;
    const body = {
      name: f.name.value,
      model: examples.models[f.model.value],
      strategy: examples.strategies[f.strategy.value],
      training: examples.training,
      steps: Number(f.steps.value),
      device: "cpu",
    };
    if (f.profile_every && f.profile_every.value !== "") body.profile_every = Number(f.profile_every.value);
    if (f.team) body.team = f.team.value;
    const button = document.getElementById("launch-button");
    button.disabled = true;
    const r = await postJSON("/api/jobs/", body);
    button.disabled = false;
    if (r.status === 201) { location.assign(`/jobs/${r.body.id}/`); return; }
    showErrorLines(errors, failureLines(r, "launch failed"));
  });
}

// ---------------------------------------------------------------------------------------- job detail

// The chart series of one job, built from its train events. A step that does not increase (a relaunch,
// a restart from a snapshot) starts a new segment: a null point breaks the lines there.
class JobSeries {
  constructor() {
    this.lastStep = null;
    this.recent = [];   // the latest steady steps: {step_time_s, tokens_per_s}
    this.memory = null;
    this.expertLoad = null;
    this.expertImbalance = null;
  }

  // -> list of [chart, trace, x, y] points to append
  points(e) {
    const v = e.values || {};
    const out = [];
    const x = e.step;
    if (this.lastStep !== null && x <= this.lastStep) {
      for (const [chart, traces] of [["loss", [0, 1]], ["tokens", [0]], ["memory", [0]]]) {
        for (const t of traces) out.push([chart, t, null, null]);
      }
      this.recent = [];
    }
    const first = this.lastStep === null || x <= this.lastStep;
    this.lastStep = x;
    out.push(["loss", 0, x, v.loss ?? null]);
    out.push(["loss", 1, x, v.loss ?? null]);  // the caller smooths trace 1
    out.push(["tokens", 0, x, v.tokens_per_s ?? null]);
    out.push(["memory", 0, x, v.memory_GiB ?? null]);
    // step-time split, stacked: bubble from the schedule, compute and exposed comm from the latest
    // profiled step, the rest unattributed (optimizer, data, launch). A profiled step itself is left
    // out: the profiler slows it several times over, and it would flatten every other bar.
    if (v.profiled) {
      for (const t of [0, 1, 2, 3]) out.push(["step", t, x, null]);
      return this.note(v, first, out);
    }
    const total = v.step_time_s ?? 0;
    const bubble = total * (v.bubble_fraction ?? 0);
    let left = Math.max(total - bubble, 0);
    const compute = v.compute_s != null ? Math.min(v.compute_s, left) : 0;
    left -= compute;
    const comm = (v.exposed_comm_s ?? v.comm_s) != null ? Math.min(v.exposed_comm_s ?? v.comm_s, left) : 0;
    left -= comm;
    out.push(["step", 0, x, compute], ["step", 1, x, comm], ["step", 2, x, bubble], ["step", 3, x, left]);
    return this.note(v, first, out);
  }

  // remember what the figures table and the expert chart show
  note(v, first, out) {
    if (!first && !v.profiled && v.step_time_s) {
      this.recent.push({ step_time_s: v.step_time_s, tokens_per_s: v.tokens_per_s });
      if (this.recent.length > STEADY_WINDOW) this.recent.shift();
    }
    if (v.memory_GiB != null) this.memory = v.memory_GiB;
    if (Array.isArray(v.expert_load)) {
      this.expertLoad = v.expert_load;
      this.expertImbalance = v.expert_imbalance;
    }
    return out;
  }

  steady(key) {
    if (!this.recent.length) return null;
    return this.recent.reduce((a, r) => a + (r[key] || 0), 0) / this.recent.length;
  }
}

class JobDetail {
  constructor(page) {
    this.page = page;
    this.state = page.state;
    this.measured = null;  // the run summary of the latest attempt, once it finished
    this.predicted = page.plan_predicted || {};
    this.series = new JobSeries();
    this.lastSeq = 0;
    this.el = (id) => document.getElementById(id);
    this.smoothing = Number(this.el("loss-smoothing").value);
    this.ema = new Ema(this.smoothing);
    this.charts = {};
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
    const data = { loss: [[], []], tokens: [[]], memory: [[]], step: [[], [], [], []] };
    for (const e of all) {
      this.lastSeq = Math.max(this.lastSeq, e.seq);
      if (e.kind === "train") {
        for (const [chart, trace, x, y] of this.series.points(e)) {
          const arr = data[chart][trace];
          arr.push([x, chart === "loss" && trace === 1 ? this.ema.push(y) : y]);
        }
      } else if (e.kind === "event") {
        this.timeline(e);
        this.noteSummary(e.values || {});
      }
    }
    // the page's state is the database's; history may lag it by a relay batch, never lead it
    if (!this.measured && this.page.state === "succeeded" && this.page.measured) this.measured = this.page.measured;
    this.plot(data);
    this.figures();
    this.el("job-log").scrollTop = this.el("job-log").scrollHeight;
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

  plot(data) {
    const xs = (pts) => pts.map((p) => p[0]);
    const ys = (pts) => pts.map((p) => p[1]);
    const uirevision = `job-${this.page.id}`;
    const line = (name, pts, color, extra = {}) => ({
      type: "scatter", mode: "lines", name, x: xs(pts), y: ys(pts), line: { color, width: 2 }, connectgaps: false, ...extra,
    });
    const p = this.predicted;
    // loss: raw (faint, trace 0) and smoothed (trace 1)
    this.charts.loss = this.el("chart-loss");
    Plotly.newPlot(this.charts.loss, [
      line("loss", data.loss[0], "rgba(199,0,11,.28)", { mode: "lines+markers", marker: { size: 3 } }),
      line("smoothed", data.loss[1], COLORS[0]),
    ], chartLayout({ yTitle: "loss", uirevision }), PLOT_CONFIG);

    this.charts.tokens = this.el("chart-tokens");
    Plotly.newPlot(this.charts.tokens, [line("tokens/s", data.tokens[0], COLORS[1])],
      withReferences(chartLayout({ yTitle: "tokens/s", uirevision }),
        p.tokens_per_s != null && referenceLine(p.tokens_per_s, `predicted ${formatNumber(p.tokens_per_s)} tokens/s`)),
      PLOT_CONFIG);

    this.charts.step = this.el("chart-step");
    const bar = (name, pts, color) => ({ type: "bar", name, x: xs(pts), y: ys(pts), marker: { color } });
    Plotly.newPlot(this.charts.step, [
      bar("compute", data.step[0], COLORS[1]),
      bar("exposed comm", data.step[1], COLORS[0]),
      bar("pipeline bubble", data.step[2], COLORS[3]),
      bar("other / not profiled", data.step[3], "#afb8c1"),
    ], withReferences(chartLayout({ yTitle: "seconds", uirevision, barmode: "stack", bargap: 0.1 }),
      p.step_time_s != null && referenceLine(p.step_time_s, `predicted ${formatSeconds(p.step_time_s)}`, "#1d2430")),
    PLOT_CONFIG);

    this.charts.memory = this.el("chart-memory");
    const predictedMemory = (p.memory_GiB_per_device || {}).total;
    Plotly.newPlot(this.charts.memory, [line("peak memory (GiB)", data.memory[0], COLORS[2])],
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
    for (const name of ["loss", "tokens", "step", "memory"]) {
      this.appenders[name] = new TraceAppender(this.charts[name]);
    }
    this.el("loss-smoothing").addEventListener("input", (ev) => this.resmooth(Number(ev.target.value)));
    this.el("loss-smoothing-value").textContent = formatNumber(this.smoothing, 2);
  }

  resmooth(weight) {
    this.appenders.loss.flush();
    this.smoothing = weight;
    this.el("loss-smoothing-value").textContent = formatNumber(weight, 2);
    const raw = this.charts.loss.data[0];
    this.ema = new Ema(weight);
    const smoothed = raw.y.map((y) => this.ema.push(y));
    Plotly.restyle(this.charts.loss, { x: [raw.x.slice()], y: [smoothed] }, [1]);
  }

  live(e) {
    this.lastSeq = e.seq;
    if (e.kind === "train") {
      for (const [chart, trace, x, y] of this.series.points(e)) {
        this.appenders[chart].push(trace, x, chart === "loss" && trace === 1 ? this.ema.push(y) : y);
      }
      if (this.charts.experts && this.series.expertLoad) this.updateExperts();
      if (this.state !== "running" && !TERMINAL.has(this.state)) this.setState("running");
      this.figures();
    } else if (e.kind === "event") {
      this.timeline(e);
      this.noteSummary(e.values || {});
      const state = e.values && e.values.state;
      if (state === "finished") this.figures();
      if (JOB_STATES.has(state)) {
        this.setState(state);
        if (state === "queued" && e.values.attempt) this.el("job-attempts").textContent = e.values.attempt;
        if (TERMINAL.has(state)) this.refresh();
      }
    }
  }

  // a "finished" event carries the run summary; a new attempt ("queued") starts without one
  noteSummary(v) {
    if (v.state === "finished") this.measured = v;
    else if (v.state === "queued") this.measured = null;
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
    this.el("cancel-button").hidden = TERMINAL.has(state);
    this.el("relaunch-button").hidden = !(state === "failed" || state === "cancelled");
    if (!TERMINAL.has(state)) this.el("cancel-button").disabled = false;
  }

  // predicted vs measured, side by side
  figures() {
    const p = this.predicted;
    const m = this.measured && this.measured.step_time_s != null ? this.measured : null;
    const stepTime = m ? m.step_time_s : this.series.steady("step_time_s");
    const tokens = m ? m.tokens_per_s : this.series.steady("tokens_per_s");
    const memory = m && m.memory_GiB != null ? m.memory_GiB : this.series.memory;
    const predictedMemory = (p.memory_GiB_per_device || {}).total;
    const cell = (id, text, value) => {
      const el = this.el(id);
      el.textContent = text;
      if (value != null && Number.isFinite(value)) el.dataset.value = value; else delete el.dataset.value;
    };
    const ratio = (a, b) => (a != null && b ? a / b : null);
    cell("predicted-step-time", p.step_time_s != null ? formatSeconds(p.step_time_s) : "no plan", p.step_time_s);
    cell("measured-step-time", formatSeconds(stepTime), stepTime);
    const r1 = ratio(stepTime, p.step_time_s);
    cell("step-time-ratio", formatRatio(r1), r1);
    cell("predicted-tokens", formatNumber(p.tokens_per_s), p.tokens_per_s);
    cell("measured-tokens", formatNumber(tokens), tokens);
    const r2 = ratio(tokens, p.tokens_per_s);
    cell("tokens-ratio", formatRatio(r2), r2);
    cell("predicted-memory", formatGiB(predictedMemory, 2), predictedMemory);
    cell("measured-memory", formatGiB(memory, 3), memory);
    const r3 = ratio(memory, predictedMemory);
    cell("memory-ratio", formatRatio(r3), r3);
    this.el("measured-note").textContent = m
      ? "Measured: the run summary (steady steps: the first step and profiled steps left out)."
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
    state.className = `state ${v.state || ""}`;
    state.textContent = v.state || "event";
    const detail = document.createElement("span");
    detail.className = "detail";
    detail.textContent = describe(v, e.step);
    li.append(time, " ", state, " ", detail);
    this.el("job-events").append(li);
  }

  async refresh() {
    const r = await getJSON(this.page.api);
    if (!r.ok) return;
    const job = r.body;
    if (job.state === "succeeded" && job.measured) this.measured = job.measured;
    this.setState(job.state);
    this.el("job-attempts").textContent = job.attempts;
    const log = this.el("job-log");
    log.textContent = job.log_tail || "(no log)";
    log.scrollTop = log.scrollHeight;
    const err = this.el("job-error");
    err.textContent = job.human_readable_error || "";
    err.hidden = !job.human_readable_error;
    this.figures();
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
      if (TERMINAL.has(r.body.state)) this.setState(r.body.state);
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
      this.series.recent = [];
      this.setState(r.body.state);
      this.el("job-attempts").textContent = r.body.attempts;
      this.el("job-error").hidden = true;
    });
  }
}

// One line of the events timeline for an event's values.
function describe(v, step) {
  switch (v.state) {
    case "queued": return v.attempt ? `attempt ${v.attempt}` : "";
    case "running": return [v.attempt && `attempt ${v.attempt}`, v.nodes && `${v.nodes} node(s)`, v.ranks && `${v.ranks} ranks`].filter(Boolean).join(", ");
    case "launching": return [v.attempt && `attempt ${v.attempt}`, v.nodes && `on ${v.nodes.join(", ")}`].filter(Boolean).join(" ");
    case "started": return `${v.world_size} ranks · ${v.strategy} · ${v.device}/${v.backend} · ${v.model} · ${formatNumber(v.params)} params` + (v.start_step ? ` · resumed at step ${v.start_step}` : "");
    case "finished": return `step ${step} · ${formatSeconds(v.step_time_s)}/step · ${formatNumber(v.tokens_per_s)} tokens/s · loss ${formatNumber(v.loss_first, 3)} → ${formatNumber(v.loss_last, 3)}`;
    case "succeeded": case "failed": case "cancelled": {
      const parts = [];
      if (v.message) parts.push(v.message);
      if (v.exit_codes) parts.push(`exit codes ${v.exit_codes.join(", ")}`);
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

export function initCompare(series) {
  const lossDiv = document.getElementById("compare-loss");
  const tokensDiv = document.getElementById("compare-tokens");
  const trace = (s, i, key) => ({
    type: "scatter", mode: "lines", name: `#${s.id} ${s.name} (${s.strategy})`, x: s.step, y: s[key],
    line: { color: COLORS[i % COLORS.length], width: 2 }, connectgaps: false,
  });
  Plotly.newPlot(lossDiv, series.map((s, i) => trace(s, i, "loss")), chartLayout({ yTitle: "loss", uirevision: "compare" }), PLOT_CONFIG);
  Plotly.newPlot(tokensDiv, series.map((s, i) => trace(s, i, "tokens_per_s")), chartLayout({ yTitle: "tokens/s", uirevision: "compare" }), PLOT_CONFIG);
  const running = series.filter((s) => !s.finished);
  const page = { lossDiv, tokensDiv, series };
  if (!running.length) { document.getElementById("live-status").textContent = "all finished"; return page; }
  const index = new Map(series.map((s, i) => [s.stream, i]));
  const lastStep = new Map(series.map((s) => [s.stream, s.step.length ? s.step[s.step.length - 1] : null]));
  const loss = new TraceAppender(lossDiv);
  const tokens = new TraceAppender(tokensDiv);
  page.client = new LiveClient({
    onStatus: (st) => { const el = document.getElementById("live-status"); el.textContent = st; el.dataset.state = st; },
    onEvent: (e) => {
      const i = index.get(e.stream);
      if (e.kind === "train") {
        const prev = lastStep.get(e.stream);
        if (prev != null && e.step <= prev) { loss.push(i, null, null); tokens.push(i, null, null); }
        lastStep.set(e.stream, e.step);
        loss.push(i, e.step, e.values.loss ?? null);
        tokens.push(i, e.step, e.values.tokens_per_s ?? null);
      } else if (e.kind === "event" && JOB_STATES.has(e.values?.state)) {
        const pill = document.querySelector(`#compared-jobs tr[data-job="${series[i].id}"] .state`);
        if (pill) setStatePill(pill, e.values.state);
      }
    },
  });
  for (const s of running) page.client.subscribe(s.stream, s.last_seq);
  return page;
}

