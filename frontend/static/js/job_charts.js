// The job page's charts (loss, tokens/s, step-time split, memory, expert load): one group of traces per
// attempt, next to the plan's prediction; the faults as markers on the loss chart. History is collected
// first and drawn once; live points are appended after that without redrawing (TraceAppender).
import {
  COLORS, Ema, FAULT_AXIS, PLOT_CONFIG, TraceAppender, chartLayout, faultShapes, faultTrace, referenceLine,
  track, whenSeen, withReferences,
} from "./charts.js";
import { formatGiB, formatNumber, formatSeconds } from "./common.js";
import { describeFault } from "./job_faults.js";
import { TRACES_PER_ATTEMPT } from "./job_series.js";

const STEP_PARTS = [["compute", 1], ["exposed comm", 0], ["pipeline bubble", 3], ["other / not profiled", null]];
const STEP_PATTERNS = ["", "/", "x", ".", "+", "\\"];

export class JobCharts {
  // `series`: the job's JobSeries (job_series.js), whose attempts own the trace slots
  constructor(page, series) {
    this.page = page;
    this.predicted = page.plan_predicted || {};
    this.series = series;
    this.el = (id) => document.getElementById(id);
    this.charts = {};
    this.history = { loss: [], tokens: [], memory: [], step: [] };  // per chart: per trace, [x, y] points
    this.faultTrace = false;  // the loss chart has the fault markers' trace (its last one)
    // the charts are drawn once plotly.js has loaded after the page and they are seen (charts.js whenSeen),
    // from the history as it is then (`drawn[name]` false until then); the page feeds live points only once
    // every chart is drawn (job_detail.js awaits chartsDrawn before it subscribes)
    this.drawn = {};
  }

  // chart `name` drawn by `draw` once its div is seen
  drawWhenSeen(name, draw) {
    this.drawn[name] = false;
    track(whenSeen(this.charts[name]).then(() => {
      draw();
      this.drawn[name] = true;
    }));
  }

  // points of an attempt from the stored history (series.points(e)), drawn at once by plot()
  collect(series, points) {
    for (const [chart, t, x, y] of points) {
      const i = series.slot * TRACES_PER_ATTEMPT[chart] + t;
      while (this.history[chart].length <= i) this.history[chart].push([]);
      this.history[chart][i].push([x, y]);
    }
  }

  // points of an attempt while the page is open, appended to its traces
  append(series, points) {
    const base = (chart) => series.slot * TRACES_PER_ATTEMPT[chart];
    for (const [chart, t, x, y] of points) this.appenders[chart].push(base(chart) + t, x, y);
  }

  // every attempt's traces on one chart, from the collected history
  traces(chart) {
    const n = TRACES_PER_ATTEMPT[chart];
    return [...this.series.attempts.values()].flatMap((s) =>
      this.tracesOf(chart, s, this.history[chart].slice(s.slot * n, s.slot * n + n)));
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
        // measured every val_every steps: the points joined across the steps between them
        line(`attempt ${n} validation`, 2, color(5), { mode: "lines+markers", marker: { size: 6 }, connectgaps: true,
          line: { color: color(5), width: 2, dash: "dot" }, showlegend: Boolean(this.page.validation) }),
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

  // every chart, from the collected history; `faults`: the fault markers' rows
  plot(faults) {
    const uirevision = `job-${this.page.id}`;
    const p = this.predicted;
    const traces = (chart) => this.traces(chart);
    this.charts.loss = this.el("chart-loss");
    this.faults = faults;
    this.drawWhenSeen("loss", () => {  // with the faults known when it is drawn (showFaults keeps them)
      const known = this.faults;
      // the fault markers' trace (once there is a fault) comes after every attempt's three loss traces
      this.faultTrace = known.length > 0;
      Plotly.newPlot(this.charts.loss, [...traces("loss"), ...(this.faultTrace ? [faultTrace(known, describeFault)] : [])],
        { ...chartLayout({ yTitle: "loss", uirevision }), ...FAULT_AXIS, shapes: faultShapes(known) }, PLOT_CONFIG);
    });

    this.charts.tokens = this.el("chart-tokens");
    this.drawWhenSeen("tokens", () => Plotly.newPlot(this.charts.tokens, traces("tokens"),
      withReferences(chartLayout({ yTitle: "tokens/s", uirevision }),
        p.tokens_per_s != null && referenceLine(p.tokens_per_s, `predicted ${formatNumber(p.tokens_per_s)} tokens/s`)),
      PLOT_CONFIG));

    this.charts.step = this.el("chart-step");
    this.drawWhenSeen("step", () => Plotly.newPlot(this.charts.step, traces("step"),
      withReferences(chartLayout({ yTitle: "seconds", uirevision, barmode: "stack", bargap: 0.1 }),
        p.step_time_s != null && referenceLine(p.step_time_s, `predicted ${formatSeconds(p.step_time_s)}`, "#1d2430")),
      PLOT_CONFIG));

    this.charts.memory = this.el("chart-memory");
    const predictedMemory = (p.memory_GiB_per_device || {}).total;
    this.drawWhenSeen("memory", () => Plotly.newPlot(this.charts.memory, traces("memory"),
      withReferences(chartLayout({ yTitle: "GiB", uirevision }),
        predictedMemory != null && referenceLine(predictedMemory, `predicted ${formatGiB(predictedMemory, 2)}`)),
      PLOT_CONFIG));

    this.charts.experts = this.el("chart-experts");
    if (this.charts.experts) {
      this.drawWhenSeen("experts", () => {  // the newest load when it is drawn
        const load = this.series.expertLoad || [];
        Plotly.newPlot(this.charts.experts, [{
          type: "bar", name: "share of routed tokens", x: load.map((_, i) => `expert ${i}`), y: load, marker: { color: COLORS[4] },
        }], withReferences(chartLayout({ xTitle: "expert", yTitle: "share of tokens", uirevision }),
          load.length && referenceLine(1 / load.length, "balanced")), PLOT_CONFIG);
      });
    }

    this.appenders = {};
    for (const name of Object.keys(TRACES_PER_ATTEMPT)) {
      this.appenders[name] = new TraceAppender(this.charts[name]);
    }
    this.el("loss-smoothing").addEventListener("input", (ev) => this.resmooth(Number(ev.target.value)));
    this.el("loss-smoothing-value").textContent = formatNumber(this.series.smoothing, 2);
  }

  // a new attempt during the page's life: its traces go after the others' (their indices stay)
  addAttempt(series) {
    for (const chart of Object.keys(TRACES_PER_ATTEMPT)) {
      this.appenders[chart].flush();
      if (chart === "loss" && this.faultTrace) {  // before the fault markers: attempts keep 3*slot .. 3*slot+2
        const at = TRACES_PER_ATTEMPT.loss * series.slot;
        Plotly.addTraces(this.charts.loss, this.tracesOf(chart, series), [at, at + 1, at + 2]);
      } else {
        Plotly.addTraces(this.charts[chart], this.tracesOf(chart, series));
      }
    }
  }

  // the fault markers on the loss chart (their trace is the last one), once it is drawn
  showFaults(faults) {
    this.faults = faults;
    const div = this.charts.loss;
    if (!(div && div.data && faults.length)) return;
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

  resmooth(weight) {
    this.series.smoothing = weight;
    this.el("loss-smoothing-value").textContent = formatNumber(weight, 2);
    if (this.drawn.loss === false) {  // not drawn yet: smooth the history it will be drawn from
      for (const s of this.series.attempts.values()) {
        const raw = this.history.loss[TRACES_PER_ATTEMPT.loss * s.slot] || [];
        s.ema = new Ema(weight);
        this.history.loss[TRACES_PER_ATTEMPT.loss * s.slot + 1] = raw.map(([x, y]) => [x, s.ema.push(y)]);
      }
      return;
    }
    this.appenders.loss.flush();
    const xs = [], ys = [], indices = [];
    for (const s of this.series.attempts.values()) {
      const raw = this.charts.loss.data[TRACES_PER_ATTEMPT.loss * s.slot];
      s.ema = new Ema(weight);
      const smoothed = raw.y.map((y) => s.ema.push(y));
      xs.push(raw.x.slice()); ys.push(smoothed); indices.push(TRACES_PER_ATTEMPT.loss * s.slot + 1);
    }
    Plotly.restyle(this.charts.loss, { x: xs, y: ys }, indices);
  }

  // the expert-load chart (MoE jobs only) from the latest train event that carried it
  updateExperts() {
    const load = this.series.expertLoad;
    if (!this.charts.experts || !load) return;
    Plotly.restyle(this.charts.experts, { x: [load.map((_, i) => `expert ${i}`)], y: [load] }, [0]);
    if (this.series.expertImbalance != null) {
      this.el("expert-imbalance").textContent = `max/mean ${formatNumber(this.series.expertImbalance, 2)}`;
    }
  }
}
