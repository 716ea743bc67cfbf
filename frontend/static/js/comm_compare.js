// "Compare communication methods" on a job page: start a comparison, follow it (which method runs, its
// step k of n, an ETA from the measured step times) with a Cancel button, fill the table as each method's
// row arrives, and at the end chart bytes per step against step time with the recommendation for this link.
// Everything comes from the job's live stream ({kind: "progress", values: {comm_compare: {...}}}, written by
// controlplane/jobs/comparisons.py) and the comparison API; the recommendation is the engine's
// (workers.training.comm.compare.recommend), never re-derived here.
import { LiveClient } from "./live.js";
import {
  MISSING, failureLines, formatBytes, formatNumber, formatPercent, formatRatio, formatSeconds, getJSON, h, postJSON,
} from "./common.js";
import { COLORS, PLOT_CONFIG, reactWhenSeen } from "./charts.js";

const num = (x, digits = 3) => formatNumber(x, digits);
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

// "42 s", "3 min 05 s", "1 h 02 min"
function duration(s) {
  if (s == null || !Number.isFinite(s)) return MISSING;
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

function withRatios(rows) {
  // the same ratios as workers.training.comm.compare.add_ratios, for rows streamed before the end
  const dense = rows.dense;
  if (!dense) return rows;
  for (const row of Object.values(rows)) {
    row.bytes_reduction_vs_dense ??= dense.bytes_per_rank_per_step / Math.max(1, row.bytes_per_rank_per_step);
    row.speedup_vs_dense ??= dense.step_time_s / row.step_time_s;
    if (row.loss_avg_last10 != null && dense.loss_avg_last10) {
      row.loss_rel_diff_vs_dense ??= (row.loss_avg_last10 - dense.loss_avg_last10) / dense.loss_avg_last10;
    }
  }
  return rows;
}

export function initCommCompare(data) {
  const root = document.getElementById("comm-compare");
  const form = document.getElementById("comm-compare-form");
  const status = document.getElementById("comm-compare-status");
  const body = document.querySelector("#comm-compare-table tbody");
  const note = document.getElementById("comm-compare-note");
  const box = document.getElementById("comm-compare-progress");
  const cancel = document.getElementById("comm-compare-cancel");
  const advice = document.getElementById("comm-compare-recommendation");
  const chart = document.getElementById("comm-compare-chart");
  // the comparison the panel shows: its id, state, methods asked for, rows so far, latest step report
  let c = { id: null, state: null, methods: [], rows: {}, step: null, result: null };

  function renderTable() {
    withRatios(c.rows);
    const best = c.result && c.result.recommendation ? c.result.recommendation.method : null;
    body.replaceChildren(...Object.entries(c.rows).map(([method, r]) => h("tr",
      { dataset: { method }, class: method === best ? "best" : null },
      [method, formatBytes(r.bytes_per_rank_per_step), formatRatio(r.bytes_reduction_vs_dense), num(r.comm_s_total),
       num(r.comm_s_exposed), num(r.step_time_s), formatRatio(r.speedup_vs_dense), num(r.tokens_per_s, 0),
       num(r.loss_avg_last10 ?? r.loss_last, 4), formatPercent(r.loss_rel_diff_vs_dense, 1, { signed: true })]
        .map((text, i) => h("td", { class: i ? "num" : null }, text)))));
    root.dataset.rows = Object.keys(c.rows).length;
  }

  function renderProgress() {
    const running = c.state === "queued" || c.state === "running";
    box.hidden = !running;
    root.dataset.state = c.state || "";
    if (!running) return;
    const p = c.step;
    const methods = (p && p.methods) || c.methods;
    const fraction = p ? p.fraction : c.progress || 0;
    box.dataset.state = "running";
    box.querySelector(".bar > span").style.width = `${(100 * fraction).toFixed(1)}%`;
    box.querySelector(".bar").setAttribute("aria-valuenow", String(Math.round(100 * fraction)));
    let text;
    if (c.state === "queued") text = "queued: waiting for a training worker";
    else if (!p) text = `running · ${formatPercent(fraction, 0)} (next report within seconds)`;
    else {
      const which = `${p.method} (${p.index + 1} of ${methods.length})`;
      text = p.step === 0
        ? `${which}: starting — torchrun in each node's namespace, rendezvous, model build`
        : `${which}: step ${p.step} of ${p.steps}` + (p.step_time_s != null ? ` · ${formatSeconds(p.step_time_s)}/step` : "");
      text += ` · elapsed ${duration(p.elapsed_s)} · ` +
        (p.eta_s != null ? `about ${duration(p.eta_s)} left (from the measured step times)` : "ETA after the first step");
    }
    box.dataset.method = p ? p.method : "";
    box.dataset.step = p ? String(p.step) : "";
    box.querySelector(".progress-text").textContent = text;
    box.querySelector(".progress-methods").replaceChildren(...methods.map((m, i) => {
      const row = c.rows[m];
      const now = p && p.method === m && !row;
      const label = row ? `✓ ${m} — ${formatSeconds(row.step_time_s)}/step`
        : now ? `▶ ${m} — ${p.step ? `step ${p.step} of ${p.steps}` : "starting"}`
        : `· ${m} — waiting`;
      return h("li", { dataset: { method: m, done: row ? "1" : now ? "running" : "0" }, class: row ? null : now ? null : "muted" }, label);
    }));
    if (!c.cancelling) { cancel.disabled = false; cancel.textContent = "Cancel comparison"; }
  }

  function renderResult() {
    const result = c.result;
    const rec = result && result.recommendation;
    advice.hidden = !rec;
    if (rec) {
      const excluded = Object.entries(rec.excluded || {}).map(([m, why]) => `${m}: ${why}`);
      advice.replaceChildren(
        h("b", {}, rec.method ? `Recommended for this link: ${rec.method}` : "No recommendation"),
        ` — ${rec.reason}.`,
        h("br"),
        h("span", { class: "muted small" }, `Rule: the fastest median step time among the methods whose loss (mean of the last ` +
          `10 steps) is at most ${formatPercent(rec.loss_tolerance, 0)} above dense's` +
          (excluded.length ? `; left out — ${excluded.join("; ")}` : "") + "."));
      advice.dataset.method = rec.method || "";
    }
    const rows = Object.entries(c.rows);
    chart.hidden = !TERMINAL.has(c.state) || rows.length < 1;
    if (chart.hidden) return;
    const best = rec ? rec.method : null;
    const colour = (m) => (m === best ? COLORS[2] : m === "dense" ? COLORS[5] : COLORS[1]);
    const trace = {
      type: "scatter", mode: "markers+text", name: "methods",
      x: rows.map(([, r]) => r.bytes_per_rank_per_step), y: rows.map(([, r]) => r.step_time_s),
      text: rows.map(([m]) => m), textposition: "top center", cliponaxis: false,
      marker: { size: rows.map(([m]) => (m === best ? 16 : 11)), color: rows.map(([m]) => colour(m)),
                symbol: rows.map(([m]) => (m === best ? "star" : "circle")) },
      customdata: rows.map(([, r]) => [formatRatio(r.speedup_vs_dense), formatPercent(r.loss_rel_diff_vs_dense, 1, { signed: true })]),
      hovertemplate: "%{text}<br>%{x:.3s}B per rank per step<br>%{y:.3f} s/step<br>speed-up %{customdata[0]} · loss %{customdata[1]} vs dense<extra></extra>",
    };
    // room around the points for their labels: a quarter of a decade each side, a third above the slowest
    const logs = trace.x.map((b) => Math.log10(Math.max(1, b)));
    const layout = {
      height: 300, margin: { l: 60, r: 20, t: 30, b: 50 }, showlegend: false,
      title: { text: "bytes per step vs step time (lower left is better; ★ recommended)", font: { size: 13 } },
      xaxis: { title: { text: "bytes per rank per step (log)" }, type: "log", ticksuffix: "B",
               range: [Math.min(...logs) - 0.25, Math.max(...logs) + 0.25] },
      yaxis: { title: { text: "median step time (s)" }, range: [0, 1.35 * Math.max(...trace.y)] },
    };
    reactWhenSeen(chart, [trace], layout, PLOT_CONFIG).then(() => { chart.dataset.ready = "1"; });
  }

  function statusLine() {
    const parts = [`comparison #${c.id}: ${c.state}`];
    if (c.error) parts.push(c.error);
    status.textContent = parts.join(" — ");
  }

  function renderAll() { renderTable(); renderProgress(); renderResult(); statusLine(); }

  function show(comparison) {
    const result = comparison.result || null;
    c = { id: comparison.id, state: comparison.state, methods: (comparison.request && comparison.request.methods) || [],
          rows: result && result.methods ? { ...result.methods } : {}, step: null, progress: comparison.progress || 0,
          result: result && !result.partial ? result : (comparison.state === "cancelled" ? result : null),
          error: comparison.error || comparison.human_readable_error || "", cancelling: comparison.cancel_requested };
    if (result && result.network) {
      const n = result.network;
      note.textContent = `${n.nodes} nodes × ${n.ranks_per_node} ranks, inter-node ${n.inter_node_gbit} Gbit/s` +
        (n.measured_goodput_gbit ? ` (measured ${n.measured_goodput_gbit} Gbit/s)` : "") + (n.note ? `; ${n.note}` : "") +
        `; model ${result.model.name} (${formatNumber(result.model.params / 1e6, 1)} M params), ${result.setup.steps} steps each.`;
    }
    renderAll();
  }

  if (data.comparisons.length) show(data.comparisons[0]);
  // a comparison still running when the page opened: its progress so far from the API
  if (c.id && !TERMINAL.has(c.state)) {
    getJSON(data.api).then((r) => {
      const row = r.ok && Array.isArray(r.body) ? r.body.find((x) => x.id === c.id) : null;
      if (row && !c.step) show(row);
    });
  }

  function onComparisonEvent(cc) {
    if (cc.id !== c.id) {
      c = { id: cc.id, state: "queued", methods: cc.methods || [], rows: {}, step: null, result: null, error: "" };
    }
    if (cc.methods) c.methods = cc.methods;
    if (cc.progress) c.step = cc.progress;
    if (cc.row) c.rows[cc.method] = cc.row;
    if (cc.state) c.state = cc.state;
    if (cc.message) c.error = cc.message;
    if (cc.result) {
      c.result = cc.result;
      c.rows = { ...(cc.result.methods || {}) };
    }
    renderAll();
  }

  const client = new LiveClient({
    onEvent: (e) => {
      const cc = (e.kind === "progress" || e.kind === "event") && e.values && e.values.comm_compare;
      if (cc) onComparisonEvent(cc);
    },
  });
  client.subscribe(data.stream, data.last_seq);

  cancel.addEventListener("click", async () => {
    if (!c.id) return;
    cancel.disabled = true;
    c.cancelling = true;
    cancel.textContent = "cancelling…";
    const r = await postJSON(`${data.api}${c.id}/cancel/`);
    if (!r.ok) {
      c.cancelling = false;
      cancel.disabled = false;
      cancel.textContent = "Cancel comparison";
      status.textContent = failureLines(r, "cancel failed").join("; ");
      return;
    }
    if (TERMINAL.has(r.body.state)) show(r.body);
  });

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(form);
    const payload = { methods: f.getAll("methods"), steps: Number(f.get("steps")), nodes: Number(f.get("nodes")),
                      ranks_per_node: Number(f.get("ranks_per_node")), inter_node_gbit: Number(f.get("inter_node_gbit")) };
    const r = await postJSON(data.api, payload);
    if (r.status !== 201) {
      status.textContent = failureLines(r, "comparison refused").join("; ");
      return;
    }
    note.textContent = "";
    show(r.body);
  });
  return { get current() { return c; } };
}
