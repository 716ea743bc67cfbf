// The job page (frontend/templates/jobs/detail.html): history then live charts, one trace per attempt, the
// live log. History comes first (rendered into the page, then paged from the events API when long), then
// the websocket subscription resumes from the last history seq: no point is drawn twice or missed.
//
// JobDetail follows the job's state and the predicted-vs-measured figures; each panel is a module of its
// own that it feeds with the events: the charts (job_charts.js, from job_series.js's per-attempt series),
// elastic recovery (job_faults.js: fault markers, snapshots, goodput), energy and carbon (job_energy.js),
// the live log and the timeline (job_log.js), fault risk and node telemetry (risk.js); the buttons are
// job_actions.js.
import { chartsDrawn } from "./charts.js";
import { LiveClient } from "./live.js";
import { FaultRiskPanel } from "./risk.js";
import { formatGiB, formatNumber, formatPercent, formatSeconds, formatVsPredicted, getJSON } from "./common.js";
import { JOB_STATES } from "./event_text.js";
import { bindJobActions, showActionError } from "./job_actions.js";
import { JobCharts } from "./job_charts.js";
import { EnergyPanel } from "./job_energy.js";
import { ElasticPanel } from "./job_faults.js";
import { JobLog, addToTimeline } from "./job_log.js";
import { STEADY_WINDOW, TERMINAL } from "./job_rows.js";
import { JobSeries } from "./job_series.js";

const EVENTS_PAGE = 5000;   // the events API returns at most this many per call

export function setStatePill(el, state) {
  el.textContent = state;
  el.dataset.state = state;
  el.className = `state ${state}`;
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
    this.series = new JobSeries(Number(this.el("loss-smoothing").value));
    this.launchedAt = Date.parse(page.created_at) || Date.now();
    this.charts = new JobCharts(page, this.series);
    this.recovery = new ElasticPanel(page, { charts: this.charts, ended: () => TERMINAL.has(this.state) });
    this.energy = new EnergyPanel();
    this.log = new JobLog(page);
    // (the page's attempt count: its queued event may not be stored yet)
    this.risk = new FaultRiskPanel(page, () => Math.max(1, page.attempts || 0, this.series.tracker.current), () => this.state);
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
    for (const e of all) {
      this.lastSeq = Math.max(this.lastSeq, e.seq);
      const attempt = this.series.tracker.of(e);
      if (e.kind === "train") {
        const { series } = this.series.attempt(attempt);
        this.charts.collect(series, series.points(e));
        this.series.note(e.values || {});
      } else if (e.kind === "event") {
        this.event(e, attempt, { live: false });
      } else if (e.kind === "energy") {
        this.energy.note(e, attempt);
      } else if (e.kind === "telemetry" || e.kind === "risk") {
        this.risk.note(e, attempt);
      }
    }
    // the current attempt has its traces (empty until its first step) so a page always has attempt lines
    this.series.attempt(Math.max(1, this.page.attempts || 0, this.series.tracker.current));
    // the page's state is the database's; history may lag it by a relay batch, never lead it
    if (!this.measured && this.page.state === "succeeded" && this.page.measured) this.measured = this.page.measured;
    this.charts.plot([...this.recovery.faults.values()]);
    this.figures();
    this.waiting();
    this.recovery.render();
    this.energy.render();
    this.risk.render();
    this.log.scrollToEnd();
    bindJobActions(this);
    // live once the charts are drawn (plotly.js comes after the page: charts.js), so what the stream
    // appends lands on them; what arrives meanwhile is replayed from lastSeq
    await chartsDrawn();
    this.client = new LiveClient({
      onStatus: (s) => { const el = this.el("live-status"); el.textContent = s; el.dataset.state = s; },
      onEvent: (e) => this.live(e),
      onError: (m) => showActionError(m.message),
      onSubscribed: (m) => { document.body.dataset.subscribed = m.last_seq; },
    });
    this.client.subscribe(this.page.stream, this.lastSeq);
    return this;
  }

  live(e) {
    this.lastSeq = e.seq;
    const attempt = this.series.tracker.of(e);
    if (e.kind === "train") {
      const { series, created } = this.series.attempt(attempt);
      if (created) this.charts.addAttempt(series);
      this.charts.append(series, series.points(e));
      this.series.note(e.values || {});
      this.charts.updateExperts();
      this.sourceFigures(e);
      // (a recovering job is running again once its recovery is reported, not at the first step after it)
      if (this.state !== "running" && this.state !== "recovering" && !TERMINAL.has(this.state)) this.setState("running");
      this.figures();
      this.waiting();
    } else if (e.kind === "event") {
      this.event(e, attempt, { live: true });
    } else if (e.kind === "energy") {
      this.energy.note(e, attempt);
      this.energy.render();
    } else if (e.kind === "telemetry" || e.kind === "risk") {
      this.risk.note(e, attempt);
      this.risk.render();
    }
  }

  // an "event" event: a log batch, or a lifecycle step (timeline, state, summary)
  event(e, attempt, { live }) {
    const v = e.values || {};
    if (Array.isArray(v.log)) { this.log.append(v, attempt); return; }
    addToTimeline(e);
    // the rows the page was rendered with already hold what the stored history says
    if (live && (v.fault || v.recovery || v.snapshot || v.goodput)) this.recovery.note(v);
    if (v.state === "finished") this.measured = v;  // a "finished" event carries the run summary
    if (v.state === "queued") {  // a new attempt starts without one, from now
      this.measured = null;
      this.launchedAt = Date.parse(e.time) || Date.now();
    }
    if (!live) return;
    if (v.state === "queued") {
      this.row = null;
      const { series, created } = this.series.attempt(attempt);
      if (created) this.charts.addAttempt(series);
      this.risk.render();  // the new attempt's nodes have no score yet
    }
    if (v.state === "finished") this.figures();
    if (JOB_STATES.has(v.state)) {
      this.setState(v.state);
      if (v.state === "queued" && v.attempt) this.el("job-attempts").textContent = v.attempt;
      if (TERMINAL.has(v.state)) this.refresh();
    }
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
    this.log.showStoredTail(job.log_tail);
    this.showJobError(job.state, job.human_readable_error);
    this.recovery.reload(job);
    this.figures();
  }

  // the job's own message: why it failed (an error), or who cancelled it (a plain note)
  showJobError(state, text) {
    const err = this.el("job-error");
    err.textContent = text || "";
    err.hidden = !text;
    err.className = state === "cancelled" ? "muted" : "error";
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

  // tokens seen (the step x the tokens of a step) and the newest validation loss, as train events come
  sourceFigures(e) {
    const seen = this.el("job-tokens-seen");
    if (seen && e.step != null) seen.textContent = String(e.step * Number(seen.dataset.perStep || 0));
    const val = this.el("job-val-loss");
    if (val && (e.values || {}).val_loss != null) val.textContent = formatNumber(e.values.val_loss, 4);
  }

  setState(state) {
    const was = this.state;
    this.state = state;
    if (was !== state && this.risk) this.risk.render();  // the risk badge is live only while it runs
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
    const exportLink = document.getElementById("export-link");  // a Hugging Face job's trained model
    if (exportLink) exportLink.hidden = state !== "succeeded";
    if (!TERMINAL.has(state)) this.el("cancel-button").disabled = false;
    this.waiting();
    if (this.el("snapshot-table")) this.recovery.renderSnapshots();  // restore: only once the job has ended
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
}

export function initJobDetail(page) {
  const detail = new JobDetail(page);
  detail.ready = detail.start();
  return detail;
}
