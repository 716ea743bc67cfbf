// "Compare communication methods" on a job page: start a comparison, then fill the table as each
// method's row arrives on the job's live stream ({kind: "event", values: {comm_compare: {...}}}).
import { LiveClient } from "./live.js";
import { failureLines, formatBytes, formatNumber, formatPercent, formatRatio, postJSON } from "./common.js";

const num = (x, digits = 3) => formatNumber(x, digits);

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
  const form = document.getElementById("comm-compare-form");
  const status = document.getElementById("comm-compare-status");
  const body = document.querySelector("#comm-compare-table tbody");
  const note = document.getElementById("comm-compare-note");
  let current = null;  // comparison id whose rows the table shows
  let rows = {};

  function render() {
    withRatios(rows);
    body.innerHTML = "";
    for (const [method, r] of Object.entries(rows)) {
      const tr = document.createElement("tr");
      tr.dataset.method = method;
      const cells = [method, formatBytes(r.bytes_per_rank_per_step), formatRatio(r.bytes_reduction_vs_dense),
                     num(r.comm_s_total), num(r.comm_s_exposed), num(r.step_time_s), formatRatio(r.speedup_vs_dense),
                     num(r.tokens_per_s, 0), num(r.loss_avg_last10 ?? r.loss_last, 4),
                     formatPercent(r.loss_rel_diff_vs_dense, 1, { signed: true })];
      cells.forEach((text, i) => { const td = document.createElement("td"); td.textContent = text; if (i) td.className = "num"; tr.append(td); });
      body.append(tr);
    }
    document.getElementById("comm-compare").dataset.rows = Object.keys(rows).length;
  }

  function show(c) {
    current = c.id;
    rows = (c.result && c.result.methods) ? { ...c.result.methods } : {};
    status.textContent = `comparison #${c.id}: ${c.state}${c.error ? ` — ${c.error}` : ""}`;
    if (c.result && c.result.network) {
      const n = c.result.network;
      note.textContent = `${n.nodes} nodes × ${n.ranks_per_node} ranks, inter-node ${n.inter_node_gbit} Gbit/s` +
        (n.measured_goodput_gbit ? ` (measured ${n.measured_goodput_gbit} Gbit/s)` : "") + (n.note ? `; ${n.note}` : "") +
        `; model ${c.result.model.name} (${formatNumber(c.result.model.params / 1e6, 1)} M params), ${c.result.setup.steps} steps each.`;
    }
    render();
  }

  if (data.comparisons.length) show(data.comparisons[0]);

  const client = new LiveClient({
    onEvent: (e) => {
      const cc = e.kind === "event" && e.values.comm_compare;
      if (!cc) return;
      if (cc.id !== current) { current = cc.id; rows = {}; }
      if (cc.row) { rows[cc.method] = cc.row; render(); status.textContent = `comparison #${cc.id}: ${cc.method} done`; }
      if (cc.state) status.textContent = `comparison #${cc.id}: ${cc.state}${cc.message ? ` — ${cc.message}` : ""}`;
      if (cc.result) show({ id: cc.id, state: "succeeded", result: cc.result });
      document.getElementById("comm-compare").dataset.state = cc.state || "running";
    },
  });
  client.subscribe(data.stream, data.last_seq);

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
    current = r.body.id; rows = {}; render();
    status.textContent = `comparison #${r.body.id}: queued`;
  });
}
