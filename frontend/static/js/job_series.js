// The job page's data, no drawing: which attempt (launch) each event belongs to, and the chart series of
// every attempt built from its `train` events (what job_charts.js draws and the figures table averages).
import { Ema } from "./charts.js";
import { STEADY_WINDOW } from "./job_rows.js";

// traces each attempt has on each chart of the job page: loss raw + smoothed + validation (held-out tokens,
// where the job has a validation split), tokens/s, memory, and the four stacked parts of the step time;
// attempt slot k owns traces k*n .. k*n+n-1 of a chart
export const TRACES_PER_ATTEMPT = { loss: 3, tokens: 1, memory: 1, step: 4 };

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
    if (v.val_loss != null) out.push(["loss", 2, x, v.val_loss]);  // only on the steps it was measured
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
export class JobSeries {
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
