// Plotting helpers shared by the pages that chart live series (jobs) and the planner's visualizer (its
// Plotly config). Plotly is the global that /static/plotly/plotly.min.js defines (served locally, never
// a CDN). Number formats for axes and labels are common.js's.

export const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

export const COLORS = ["#c7000b", "#1f6feb", "#1a7f37", "#9a6700", "#8250df", "#57606a"];

// A layout whose `uirevision` keeps the user's zoom, pan and legend clicks across updates: a chart that
// only ever receives extendTraces / restyle never resets its axes once the user picked a range.
export function chartLayout({ xTitle = "step", yTitle = "", uirevision = "keep", ...extra } = {}) {
  return {
    uirevision,
    margin: { l: 56, r: 16, t: 28, b: 40 },
    height: 280,
    xaxis: { title: { text: xTitle }, zeroline: false },
    yaxis: { title: { text: yTitle }, zeroline: false, rangemode: "tozero" },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    hovermode: "x unified",
    ...extra,
  };
}

// A horizontal reference line across the whole x range (a prediction beside the measured series).
export function referenceLine(y, label, color = "#57606a") {
  return {
    shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, yref: "y", y0: y, y1: y,
               line: { color, width: 2, dash: "dash" } }],
    annotations: [{ xref: "paper", x: 1, xanchor: "right", yref: "y", y, yanchor: "bottom",
                    text: label, showarrow: false, font: { color, size: 11 }, bgcolor: "rgba(255,255,255,.8)" }],
  };
}

// Merge several {shapes, annotations} fragments into one layout.
export function withReferences(layout, ...refs) {
  const out = { ...layout, shapes: [...(layout.shapes || [])], annotations: [...(layout.annotations || [])] };
  for (const r of refs.filter(Boolean)) {
    out.shapes.push(...r.shapes);
    out.annotations.push(...r.annotations);
  }
  return out;
}

// Exponential moving average with TensorBoard's debiasing (the first points are not pulled to zero).
// A null value is a gap (a relaunch, a restart): it is kept and restarts the average.
export class Ema {
  constructor(weight) { this.weight = weight; this.reset(); }
  reset() { this.last = 0; this.n = 0; }
  push(value) {
    if (value == null || !Number.isFinite(value)) { this.reset(); return null; }
    this.n += 1;
    this.last = this.last * this.weight + (1 - this.weight) * value;
    return this.weight > 0 ? this.last / (1 - this.weight ** this.n) : value;
  }
}

export function ema(values, weight) {
  const e = new Ema(weight);
  return values.map((v) => e.push(v));
}

// Buffers points per trace and appends them with Plotly.extendTraces in one call a tick: no full redraw,
// no layout change (the user's zoom stays), and a burst of events costs one update.
export class TraceAppender {
  constructor(div, { delayMs = 100, onFlush = () => {} } = {}) {
    this.div = div;
    this.delayMs = delayMs;
    this.onFlush = onFlush;
    this.pending = new Map();  // trace index -> {x: [], y: []}
    this.timer = null;
  }

  push(trace, x, y) {
    if (!this.pending.has(trace)) this.pending.set(trace, { x: [], y: [] });
    const p = this.pending.get(trace);
    p.x.push(x);
    p.y.push(y);
    if (this.timer === null) this.timer = setTimeout(() => this.flush(), this.delayMs);
  }

  flush() {
    this.timer = null;
    if (!this.pending.size) return;
    const indices = [...this.pending.keys()];
    const update = { x: indices.map((i) => this.pending.get(i).x), y: indices.map((i) => this.pending.get(i).y) };
    this.pending.clear();
    Plotly.extendTraces(this.div, update, indices);
    this.onFlush();
  }
}
