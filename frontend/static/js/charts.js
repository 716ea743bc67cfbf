// Plotting helpers shared by the pages that chart live series (jobs) and the planner's visualizer (its
// Plotly config). Plotly is the global that /static/plotly/plotly.min.js defines (served locally, never
// a CDN). Number formats for axes and labels are common.js's.

// plotly.js for a page that draws a chart only on demand (the green page's schedule): its template names
// the bundle in <meta name="plotly-src"> instead of loading it with the page, and the first chart loads it
// (1.4 MB of script to compile: most of a chart page's first load; issue 35).
let plotlyLoading = null;
export function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyLoading) {
    plotlyLoading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = document.querySelector("meta[name=plotly-src]").content;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => { plotlyLoading = null; reject(new Error("plotly.js did not load")); };
      document.head.append(script);
    });
  }
  return plotlyLoading;
}

// A chart page's own content and controls come first, its charts after (issue 35): plotly.js (1.4 MB to
// compile: 370-440 ms of a cold job page here) is loaded once the page has loaded, and each chart is drawn
// when it is near the viewport or, for those below the fold, when the browser is idle after that, whichever
// is first (the job page draws ten; the plan page's pipeline schedule alone took 450 ms). Every chart is
// drawn either way; bench/page_load.py prints when the last one was, beside the load event.
const NEAR_PX = 300;
function afterLoad(fn) {
  if (document.readyState === "complete") fn(); else window.addEventListener("load", fn, { once: true });
}
function afterLoadIdle(fn) {
  afterLoad(() => (window.requestIdleCallback ? window.requestIdleCallback(fn, { timeout: 1500 }) : setTimeout(fn, 50)));
}

// plotly.js, loaded once the page has (at once where the page's template loaded it itself)
let plotlyAfterLoad = null;
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyAfterLoad) plotlyAfterLoad = new Promise((resolve) => afterLoad(resolve)).then(loadPlotly);
  return plotlyAfterLoad;
}

// resolves, with plotly.js loaded (plotlyReady), at once for an element in (or near) the viewport, else when
// it scrolls near or the page is idle
export function whenSeen(el) {
  return Promise.all([seen(el), plotlyReady()]);
}

function seen(el) {
  if (!el || typeof IntersectionObserver === "undefined") return Promise.resolve();
  const r = el.getBoundingClientRect();
  if ((r.width || r.height) && r.bottom > -NEAR_PX && r.top < window.innerHeight + NEAR_PX) return Promise.resolve();
  return new Promise((resolve) => {
    let done = false;
    const io = new IntersectionObserver((entries) => { if (entries.some((e) => e.isIntersecting)) finish(); },
      { rootMargin: `${NEAR_PX}px` });
    const finish = () => { if (done) return; done = true; io.disconnect(); resolve(); };
    io.observe(el);
    afterLoadIdle(finish);
  });
}

// The draws whenSeen holds back, until each is done: chartsDrawn() resolves once none is left (the job page
// goes live after its charts are drawn, so that what the live stream appends lands on them)
const drawing = new Set();
export function track(promise) {
  drawing.add(promise);
  const done = () => drawing.delete(promise);
  promise.then(done, done);
  return promise;
}
export async function chartsDrawn() {
  while (drawing.size) await Promise.allSettled([...drawing]);
}

// Plotly.react, once `div` is seen (whenSeen): calls before then keep only the newest figure, drawn then;
// returns Plotly's promise (of the draw that shows this figure, or of a newer one)
export function reactWhenSeen(div, traces, layout, config) {
  const el = typeof div === "string" ? document.getElementById(div) : div;
  if (el.__seen === true) return Plotly.react(el, traces, layout, config);
  el.__figure = [traces, layout, config];
  if (!el.__seen) {
    el.__seen = track(whenSeen(el).then(() => {
      el.__seen = true;
      const figure = el.__figure;
      el.__figure = null;
      return Plotly.react(el, ...figure);
    }));
  }
  return el.__seen;
}

// Every chart's modebar carries "Download data as CSV" and "Download plot as PNG" (exportButtons below,
// in place of Plotly's own PNG button, which names every file "newplot").
export const PLOT_CONFIG = {
  responsive: true,
  displaylogo: false,
  modeBarButtonsToRemove: ["lasso2d", "select2d", "toImage"],
  modeBarButtonsToAdd: exportButtons(),
};

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

// ------------------------------------------------------------------------------------ fault markers

// Faults on a step axis (the job page's loss chart): a dotted vertical line at each fault's step, a
// shaded band over the steps it cost (resumed from .. fault step), and a marker trace at the top of the
// chart on an axis of its own ("y2": 0..1, hidden) whose hover says what happened. `describe(fault)` is
// the hover text; the trace is named "faults".
export const FAULT_COLOR = "#cf222e";
export const FAULT_AXIS = { yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true } };

export function faultShapes(faults) {
  const shapes = [];
  for (const f of faults) {
    if (f.step == null) continue;
    if (f.resumed_from_step != null && f.resumed_from_step < f.step) {
      shapes.push({ type: "rect", xref: "x", x0: f.resumed_from_step, x1: f.step, yref: "paper", y0: 0, y1: 1,
                    fillcolor: FAULT_COLOR, opacity: 0.08, line: { width: 0 }, layer: "below", name: `fault-${f.id}-lost` });
    }
    shapes.push({ type: "line", xref: "x", x0: f.step, x1: f.step, yref: "paper", y0: 0, y1: 1,
                  line: { color: FAULT_COLOR, width: 1.5, dash: "dot" }, name: `fault-${f.id}` });
  }
  return shapes;
}

export function faultTrace(faults, describe) {
  const placed = faults.filter((f) => f.step != null);
  return {
    type: "scatter", mode: "markers+text", name: "faults", yaxis: "y2",
    x: placed.map((f) => f.step), y: placed.map(() => 0.97),
    text: placed.map((f) => f.kind), textposition: "bottom right", textfont: { color: FAULT_COLOR, size: 10 },
    hovertext: placed.map(describe), hovertemplate: "%{hovertext}<extra></extra>",
    marker: { symbol: "x-thin-open", size: 11, color: FAULT_COLOR, line: { width: 2, color: FAULT_COLOR } },
    cliponaxis: false, showlegend: placed.length > 0,
  };
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

// ------------------------------------------------------------------------------------------- export

// The data arrays a trace may carry, in the order they become CSV columns (bar charts of a schedule
// carry `base`, a heatmap `z`, a pie `labels` and `values`).
const DATA_KEYS = ["x", "y", "z", "base", "labels", "values"];
const isArrayLike = (a) => Array.isArray(a) || ArrayBuffer.isView(a);

// A chart's traces as a table: columns ["trace", ...the data keys any trace has], one row per point (a
// heatmap: one per cell, with its x and y). Legend-hidden traces are included.
export function chartTable(gd) {
  const traces = gd.data || [];
  const keys = DATA_KEYS.filter((k) => traces.some((t) => isArrayLike(t[k])));
  const rows = [];
  traces.forEach((t, i) => {
    const name = t.name || `trace ${i + 1}`;
    if (isArrayLike(t.z) && t.z.length && isArrayLike(t.z[0])) {  // 2-D: a heatmap
      t.z.forEach((zRow, r) => Array.from(zRow).forEach((z, c) => {
        rows.push([name, ...keys.map((k) => (k === "x" ? t.x?.[c] ?? c : k === "y" ? t.y?.[r] ?? r : k === "z" ? z : ""))]);
      }));
      return;
    }
    const n = Math.max(0, ...keys.map((k) => (isArrayLike(t[k]) ? t[k].length : 0)));
    for (let j = 0; j < n; j += 1) {
      const values = keys.map((k) => (isArrayLike(t[k]) ? t[k][j] : null));
      if (values.every((v) => v == null)) continue;  // a gap the chart draws between segments, not a point
      rows.push([name, ...values]);
    }
  });
  return { columns: ["trace", ...keys], rows };
}

// One CSV cell: numbers as they are, text quoted when it must be, and a leading = + - @ in text defused
// (a job name like "=HYPERLINK(...)" must not run as a formula in a spreadsheet).
function csvCell(v) {
  if (v == null || (typeof v === "number" && !Number.isFinite(v))) return "";
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  let s = String(v);
  if (/^[=+\-@]/.test(s)) s = `'${s}`;
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function chartCSV(gd) {
  const { columns, rows } = chartTable(gd);
  return [columns, ...rows].map((r) => r.map(csvCell).join(",")).join("\r\n") + "\r\n";
}

// "jobs-42-throughput": the page's path and the heading of the card the chart sits in.
export function chartFileName(gd) {
  const slug = (s) => String(s || "").toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 60);
  const card = gd.closest("section, .card, .view");
  const heading = card && card.querySelector("h1, h2, h3");
  const title = heading ? (heading.firstChild && heading.firstChild.nodeType === Node.TEXT_NODE
    ? heading.firstChild.textContent : heading.textContent) : "";
  return [slug(location.pathname), slug(title) || slug(gd.id) || "chart"].filter(Boolean).join("-");
}

export function downloadChartCSV(gd) {
  const url = URL.createObjectURL(new Blob([chartCSV(gd)], { type: "text/csv;charset=utf-8" }));
  const a = Object.assign(document.createElement("a"), { href: url, download: `${chartFileName(gd)}.csv` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

export function downloadChartPNG(gd) {
  return window.Plotly.downloadImage(gd, {
    format: "png", filename: chartFileName(gd), scale: 2,
    width: gd.clientWidth || undefined, height: gd.clientHeight || undefined,
  });
}

function exportButtons() {
  // filled icons in a 1000x1000 box (SVG coordinates, y down): a table, and a framed picture
  const table = "M150 150h700v150H150zM150 350h200v120H150zM400 350h450v120H400zM150 520h200v120H150z" +
    "M400 520h450v120H400zM150 690h200v120H150zM400 690h450v120H400z";
  const picture = "M100 180h800v60H100zM100 760h800v60H100zM100 180h60v640H100zM840 180h60v640H840z" +
    "M180 740l220-300 160 200 100-120 160 220zM640 330a60 60 0 1 0 120 0a60 60 0 1 0-120 0z";
  const icon = (path) => ({ width: 1000, height: 1000, path });
  return [
    { name: "downloadCSV", title: "Download data as CSV", icon: icon(table), click: (gd) => downloadChartCSV(gd) },
    { name: "downloadPNG", title: "Download plot as PNG", icon: icon(picture), click: (gd) => downloadChartPNG(gd) },
  ];
}
