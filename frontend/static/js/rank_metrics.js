// Per-rank system figures on the job page: every rank's resident memory, CPU use and peak device memory,
// which rank 0 gathers every few steps and publishes in its train events as
// `ranks: [{rank, rss_GiB, cpu_pct, mem_peak_GiB}]` (workers/training/system_metrics.py).
// A chart (one line per rank, the chosen figure over steps) and a table of the latest sample; history
// first (rendered into the page, paged on through the events API for long runs), then live.
import { LiveClient } from "./live.js";
import { COLORS, PLOT_CONFIG, chartLayout, reactWhenSeen } from "./charts.js";
import { MISSING, formatNumber, getJSON, h } from "./common.js";

const EVENTS_PAGE = 5000;  // the events API answers at most this many per call
export const RANK_FIGURES = {
  rss_GiB: { label: "resident memory (GiB)", format: (x) => formatNumber(x, 3) },
  cpu_pct: { label: "CPU (% of one core)", format: (x) => formatNumber(x, 0) },
  mem_peak_GiB: { label: "peak device memory (GiB)", format: (x) => formatNumber(x, 3) },
};

class RankMetrics {
  constructor(page) {
    this.page = page;
    this.samples = [];   // {step, ranks}; a step that does not increase (a relaunch) breaks the lines
    this.lastSeq = 0;
    this.figure = "rss_GiB";
    this.el = (id) => document.getElementById(id);
  }

  note(e) {
    this.lastSeq = Math.max(this.lastSeq, e.seq);
    const ranks = e.kind === "train" && e.values && Array.isArray(e.values.ranks) ? e.values.ranks : null;
    if (!ranks) return false;
    this.samples.push({ step: e.step, attempt: e.values.attempt ?? null, ranks });
    return true;
  }

  async start() {
    let events = this.page.history || [];
    let complete = this.page.history_complete !== false;
    for (const e of events) this.note(e);
    while (!complete) {  // a long run: page on through the stored history
      const r = await getJSON(`${this.page.api}events/?after_seq=${this.lastSeq}`);
      events = r.ok ? r.body : [];
      for (const e of events) this.note(e);
      complete = events.length < EVENTS_PAGE;
    }
    const select = this.el("rank-figure");
    select.replaceChildren(...Object.entries(RANK_FIGURES).map(([k, f]) => h("option", { value: k }, f.label)));
    select.value = this.figure;
    select.addEventListener("change", () => { this.figure = select.value; this.draw(); });
    this.draw();
    this.client = new LiveClient({
      onEvent: (e) => { if (this.note(e)) this.draw(); },
      onSubscribed: () => { this.el("rank-metrics").dataset.live = "1"; },
    });
    this.client.subscribe(this.page.stream, this.lastSeq);
    return this;
  }

  // one trace per rank: x = step, y = the chosen figure; a null point where the steps start over
  traces() {
    const byRank = new Map();
    let last = null;
    for (const s of this.samples) {
      const restart = last !== null && (s.step <= last.step || (s.attempt != null && last.attempt != null && s.attempt !== last.attempt));
      for (const r of s.ranks) {
        if (!byRank.has(r.rank)) byRank.set(r.rank, { x: [], y: [] });
        const t = byRank.get(r.rank);
        if (restart && t.x.length) { t.x.push(null); t.y.push(null); }
        t.x.push(s.step);
        t.y.push(r[this.figure] ?? null);
      }
      last = s;
    }
    return [...byRank.entries()].sort((a, b) => a[0] - b[0]).map(([rank, t], i) => ({
      type: "scatter", mode: "lines+markers", name: `rank ${rank}`, x: t.x, y: t.y, connectgaps: false,
      line: { color: COLORS[i % COLORS.length], width: 2 }, marker: { size: 4 },
    }));
  }

  draw() {
    const box = this.el("rank-metrics");
    const empty = this.el("rank-empty");
    empty.hidden = this.samples.length > 0;
    box.dataset.samples = this.samples.length;
    const chart = this.el("chart-ranks");
    const layout = chartLayout({ yTitle: RANK_FIGURES[this.figure].label, uirevision: `ranks-${this.page.id}-${this.figure}`, height: 240 });
    reactWhenSeen(chart, this.traces(), layout, PLOT_CONFIG);
    this.table();
  }

  table() {
    const latest = this.samples[this.samples.length - 1];
    const body = this.el("rank-table").tBodies[0];
    this.el("rank-sample").textContent = latest ? `sampled at step ${formatNumber(latest.step)}` : "";
    if (!latest) { body.replaceChildren(); return; }
    const most = (k) => Math.max(...latest.ranks.map((r) => r[k] ?? -Infinity));
    body.replaceChildren(...[...latest.ranks].sort((a, b) => a.rank - b.rank).map((r) => h("tr", { dataset: { rank: r.rank } },
      h("td", {}, `rank ${r.rank}`),
      ...Object.entries(RANK_FIGURES).map(([k, f]) => h("td", {
        class: `num${latest.ranks.length > 1 && r[k] != null && r[k] === most(k) ? " most" : ""}`,
        title: latest.ranks.length > 1 && r[k] === most(k) ? "the highest of the ranks" : null,
        dataset: { value: r[k] ?? "" },
      }, r[k] == null ? MISSING : f.format(r[k]))))));
  }
}

export function initRankMetrics(page) {
  const m = new RankMetrics(page);
  m.ready = m.start();
  return m;
}
