// Energy and carbon on the job page: the totals table, the meter's method (measured, or an estimate and
// why), and energy and carbon over the steps. History first, then live `energy` events.
import { COLORS, PLOT_CONFIG, chartLayout, reactWhenSeen } from "./charts.js";
import { formatNumber } from "./common.js";

export class EnergyPanel {
  constructor() {
    this.last = new Map();  // attempt -> the values of its latest energy event
    this.points = [];       // {step, kwh, kgco2e, watts}: the job's totals after each event
    this.attempt = null;    // the attempt of the newest point
  }

  // an "energy" event: the attempt's running totals since its start (workers/green/job.py); the job's are
  // the sum over attempts, as the API's (controlplane/green/selectors.py)
  note(e, attempt) {
    const v = e.values || {};
    const a = v.attempt || attempt;
    this.last.set(a, v);
    // a later attempt goes on from the step it resumed at (or 1): a break in the lines, as on the loss
    // chart, not a zig-zag back to an earlier step
    if (this.attempt != null && a !== this.attempt && this.points.length) {
      this.points.push({ step: null, kwh: null, kgco2e: null, watts: null });
    }
    this.attempt = a;
    const t = this.totals();
    this.points.push({ step: e.step, kwh: t.kwh, kgco2e: t.kgco2e, watts: v.watts });
  }

  totals() {
    const attempts = [...this.last.keys()].sort((a, b) => a - b).map((a) => this.last.get(a));
    const sum = (key) => (attempts.some((v) => v[key] == null) ? null : attempts.reduce((s, v) => s + v[key], 0));
    const latest = attempts[attempts.length - 1];
    const kwhIt = sum("kwh_it"), tokens = sum("tokens");
    return {
      latest, kwh: sum("kwh"), kwh_it: kwhIt, kgco2e: sum("kgco2e"), kgco2e_market: sum("kgco2e_market"),
      cost: sum("cost"), tokens, tokens_per_kwh: kwhIt && tokens != null ? tokens / kwhIt : null,
    };
  }

  render() {
    const el = (id) => document.getElementById(id);
    const empty = !this.last.size;
    el("energy-empty").hidden = !empty;
    if (empty) return;
    const t = this.totals();
    const v = t.latest;
    const set = (id, text, value) => {
      const cell = el(id);
      cell.textContent = text;
      if (value != null) cell.dataset.value = value; else delete cell.dataset.value;
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
    const method = el("energy-method");
    method.hidden = false;
    method.textContent = v.measured ? `measured (${v.method})` : "estimate";
    method.dataset.method = v.method;
    const caveat = el("energy-estimate");
    caveat.hidden = !!v.measured;
    caveat.textContent = v.measured ? "" : `Estimated, not measured: ${v.label || "no power meter on this machine"}` +
      (v.estimated && v.estimated.length ? ` (${v.estimated.join(", ")})` : "") + ".";
    el("energy-note").textContent = [v.carbon_note, this.last.size > 1 ? `summed over ${this.last.size} attempts` : ""]
      .filter(Boolean).join(" · ");
    const pts = this.points;
    const traces = [
      { type: "scatter", mode: "lines", name: "energy (kWh)", x: pts.map((p) => p.step), y: pts.map((p) => p.kwh), line: { color: COLORS[0] } },
      { type: "scatter", mode: "lines", name: "carbon (kgCO2e)", x: pts.map((p) => p.step), y: pts.map((p) => p.kgco2e), yaxis: "y2", line: { color: COLORS[2] } },
    ];
    const layout = chartLayout({ xTitle: "step", yTitle: "kWh" });
    layout.yaxis2 = { title: { text: "kgCO2e" }, overlaying: "y", side: "right", rangemode: "tozero" };
    layout.margin = { ...layout.margin, r: 56 };
    reactWhenSeen(el("chart-energy"), traces, layout, PLOT_CONFIG);
  }
}
