// The strategy visualizer's views as Plotly figures (served locally as window.Plotly): Pareto front,
// memory per device, step time, pipeline schedule, placement, plan diff, predicted vs measured and the
// what-if comparison. They draw what workers/planner/visual.py computed; the page controllers
// (visualizer.js) decide what to show when.
//
// Every view has a stable container (#view-pareto, #view-memory, #view-steptime, #view-schedule,
// #view-placement, #view-diff, #view-whatif, #view-measured); its Plotly graph is the container's ".plot"
// child, and the container gets data-ready="1" once drawn with data (the browser tests wait on it).
import { PLOT_CONFIG, whenSeen } from "./charts.js";
import {
  MISSING, formatGiB, formatNumber as num, formatPercent as pct, formatSeconds as secs, formatVsPredicted, h,
  predictionCaveat,
} from "./common.js";

const Plotly = () => window.Plotly;
const FONT = { family: "system-ui, -apple-system, 'Segoe UI', sans-serif", size: 12, color: "#1d2430" };
const DEFAULT_ORDER = "tp-cp-ep-dp-pp";
const STRATEGY_FIELDS = ["tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch_size", "recompute", "zero_stage",
                         "sequence_parallel"];
// Tableau-like palette: neighbouring groups get clearly different colours
const PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
                 "#9d755d", "#bab0ac", "#2f4b7c", "#a05195"];
const MEMORY_PARTS = [["params", "parameters", "#4c78a8"], ["grads", "gradients", "#72b7b2"],
                      ["optimizer", "optimizer states", "#b279a2"], ["activations", "activations", "#f58518"],
                      ["other", "framework / other", "#bab0ac"]];
const STEP_PARTS = [["compute", "compute", "#4c78a8"], ["tp", "TP comm", "#f58518"], ["ep", "EP all-to-all", "#e45756"],
                    ["cp", "CP comm (exposed)", "#72b7b2"], ["pp", "PP p2p", "#54a24b"],
                    ["dp", "DP comm (exposed)", "#eeca3b"], ["bubble", "pipeline bubble", "#bab0ac"],
                    ["optimizer", "optimizer step", "#b279a2"]];
const COMM_KINDS = [["tp", "TP"], ["pp", "PP"], ["dp", "DP"], ["ep", "EP"], ["cp", "CP"]];
const PLACEMENT_KINDS = [["ep", "EP group"], ["pp", "PP stage"], ["dp", "DP group (dp×cp)"], ["tp", "TP group"],
                         ["cp", "CP group"], ["edp", "expert-DP group"]];

// ------------------------------------------------------------------------------------------------ helpers

export function strategyText(s) {
  if (!s) return MISSING;
  const parts = [`TP${s.tp}`, `PP${s.pp}`, `DP${s.dp}`, `EP${s.ep}`, `CP${s.cp}`];
  if (s.vpp > 1) parts.push(`VPP${s.vpp}`);
  parts.push(`mbs ${s.micro_batch_size}`, `recompute ${s.recompute}`, `ZeRO-${s.zero_stage}`);
  if (s.sequence_parallel) parts.push("SP");
  if (s.order && s.order !== DEFAULT_ORDER) parts.push(`order ${s.order}`);
  return parts.join(" · ");
}

export function sameStrategy(a, b) {
  if (!a || !b) return false;
  return STRATEGY_FIELDS.every((k) => a[k] === b[k]) && (a.order || DEFAULT_ORDER) === (b.order || DEFAULT_ORDER);
}

function plotDiv(container) {
  let div = container.querySelector(":scope > .plot");
  if (!div) { div = h("div", { class: "plot" }); container.append(div); }
  return div;
}

// a view is drawn once it is seen (charts.js whenSeen); a newer figure for the same view replaces one
// still waiting
async function draw(container, traces, layout = {}) {
  const div = plotDiv(container);
  const full = { font: FONT, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff",
                 margin: { l: 60, r: 20, t: 36, b: 44 }, ...layout };
  const ticket = (container.__drawTicket || 0) + 1;
  container.__drawTicket = ticket;
  await whenSeen(container);
  if (container.__drawTicket !== ticket) return div;
  await Plotly().react(div, traces, full, PLOT_CONFIG);
  container.dataset.ready = "1";
  return div;
}

function note(container, text, cls = "muted viz-note") {
  let p = container.querySelector(":scope > .viz-note");
  if (!p) { p = h("p", { class: cls }); container.append(p); }
  p.className = cls;
  p.textContent = text || "";
  return p;
}

// ------------------------------------------------------------------------------- breakdowns of a plan
// Every breakdown is computed on the server (workers/planner/visual.py): the selected plan's arrive in
// `visuals`, every other plan on a page carries its own `breakdown` (planning.selectors.plan_document and
// /api/plans/evaluate/). A plan without predicted figures draws as empty bars.

const EMPTY_MEMORY = { parts: Object.fromEntries(MEMORY_PARTS.slice(0, 4).map(([k]) => [k, 0])), other: 0, total: 0,
                       capacity: null };
const EMPTY_STEP = { step_time_s: 0, parts: Object.fromEntries(STEP_PARTS.map(([k]) => [k, 0])),
                     comm: Object.fromEntries(COMM_KINDS.map(([k]) => [k, { total: 0, exposed: 0, overlapped: 0 }])) };

export function memoryOf(plan) {
  return (plan && plan.breakdown && plan.breakdown.memory) || EMPTY_MEMORY;
}

export function stepOf(plan) {
  return (plan && plan.breakdown && plan.breakdown.step_time) || EMPTY_STEP;
}

// ------------------------------------------------------------------------------------- view 2: memory

export function drawMemory(container, entries, capacity) {
  const labels = entries.map((e) => e.label);
  const traces = MEMORY_PARTS.map(([k, name, color]) => ({
    type: "bar", orientation: "h", name, y: labels, marker: { color },
    x: entries.map((e) => (k === "other" ? e.memory.other : e.memory.parts[k])),
    hovertemplate: `${name}: %{x:.2f} GiB<extra>%{y}</extra>`,
  }));
  const cap = capacity != null ? capacity : entries.map((e) => e.memory.capacity).find((c) => c != null);
  const maxX = Math.max(cap || 0, ...entries.map((e) => e.memory.total)) * 1.1;
  const shapes = cap ? [{ type: "line", x0: cap, x1: cap, yref: "paper", y0: 0, y1: 1,
                          line: { color: "#cf222e", width: 2, dash: "dash" } }] : [];
  const annotations = cap ? [{ x: cap, yref: "paper", y: 1, yanchor: "bottom", text: `device ${num(cap, 0)} GiB`,
                               showarrow: false, font: { color: "#cf222e" }, xanchor: "right" }] : [];
  // the total at the end of each bar
  entries.forEach((e) => annotations.push({ x: e.memory.total, y: e.label, text: ` ${num(e.memory.total, 1)} GiB`,
                                            xanchor: "left", showarrow: false, font: { size: 11 } }));
  return draw(container, traces, {
    barmode: "stack", height: 200 + 60 * entries.length, shapes, annotations, bargap: 0.35,
    xaxis: { title: { text: "GiB per device (heaviest stage)" }, range: [0, maxX || 1] },
    yaxis: { autorange: "reversed", automargin: true },
    legend: { orientation: "h", x: 0, y: -0.3, yanchor: "top", traceorder: "normal" },
    margin: { l: 10, r: 20, t: 26, b: 40 },
  });
}

// ----------------------------------------------------------------------------------- view 3: step time

export function drawStepTime(container, entries) {
  const labels = entries.map((e) => e.label);
  const traces = STEP_PARTS.map(([k, name, color]) => ({
    type: "bar", orientation: "h", name, y: labels, x: entries.map((e) => e.step.parts[k]),
    marker: { color }, xaxis: "x", yaxis: "y", legendgroup: "step",
    hovertemplate: `${name}: %{x:.3f} s<extra>%{y}</extra>`,
  }));
  const sel = entries[0].step.comm;
  traces.push({ type: "bar", name: "exposed", x: COMM_KINDS.map(([, n]) => n),
                y: COMM_KINDS.map(([k]) => sel[k].exposed), marker: { color: "#cf222e" }, xaxis: "x2", yaxis: "y2",
                legendgroup: "comm", hovertemplate: "%{x} exposed: %{y:.3f} s<extra></extra>" });
  traces.push({ type: "bar", name: "overlapped (hidden)", x: COMM_KINDS.map(([, n]) => n),
                y: COMM_KINDS.map(([k]) => sel[k].overlapped), marker: { color: "#f4b6b6" }, xaxis: "x2",
                yaxis: "y2", legendgroup: "comm", hovertemplate: "%{x} overlapped: %{y:.3f} s<extra></extra>" });
  const annotations = entries.map((e) => ({ x: e.step.step_time_s, y: e.label, xref: "x", yref: "y",
    text: ` ${secs(e.step.step_time_s)}`, xanchor: "left", showarrow: false, font: { size: 11 } }));
  annotations.push({ text: `communication by kind, ${entries[0].label}: exposed vs hidden behind compute`,
                     xref: "paper", yref: "paper", x: 0, y: 0.42, xanchor: "left", yanchor: "bottom",
                     showarrow: false, font: { size: 12, color: "#6b7585" } });
  const longest = Math.max(...entries.map((e) => e.step.step_time_s));
  return draw(container, traces, {
    barmode: "stack", height: 480, annotations, bargap: 0.3,
    xaxis: { title: { text: "seconds per step" }, anchor: "y", domain: [0, 1], range: [0, longest * 1.18 || 1] },
    yaxis: { autorange: "reversed", automargin: true, domain: [0.62, 1] },
    xaxis2: { anchor: "y2", domain: [0, 1] },
    yaxis2: { title: { text: "s per step" }, domain: [0, 0.36] },
    legend: { orientation: "v", x: 1.02, y: 1, traceorder: "normal", font: { size: 11 } },
    margin: { l: 10, r: 10, t: 10, b: 30 },
  });
}

// ------------------------------------------------------------------------------------ view 4: schedule

function idleIntervals(blocks, pp, end) {
  const byStage = Array.from({ length: pp }, () => []);
  for (const b of blocks) byStage[b.stage].push(b);
  const idle = [];
  byStage.forEach((list, s) => {
    list.sort((a, b) => a.start - b.start);
    let t = 0;
    for (const b of list) { if (b.start - t > 1e-9) idle.push({ stage: s, start: t, end: b.start }); t = b.end; }
    if (end - t > 1e-9) idle.push({ stage: s, start: t, end });
  });
  return idle;
}

export function drawSchedule(container, sched) {
  const blocks = sched.blocks || [];
  const stageLabel = (s) => `stage ${s}`;
  const makespan = blocks.reduce((m, b) => Math.max(m, b.end), 0);
  const showText = blocks.length <= 600;
  const layers = sched.layers_per_chunk;
  const trace = (kind, name, shades) => {
    const list = blocks.filter((b) => b.kind === kind);
    return {
      type: "bar", orientation: "h", name, y: list.map((b) => stageLabel(b.stage)),
      base: list.map((b) => b.start), x: list.map((b) => b.end - b.start),
      marker: { color: list.map((b) => shades[b.chunk % shades.length]), line: { color: "#fff", width: 0.5 } },
      text: showText ? list.map((b) => String(b.micro_batch)) : undefined, textposition: "inside",
      insidetextanchor: "middle", textfont: { color: "#fff", size: 10 },
      hovertext: list.map((b) => `${kind === "F" ? "forward" : "backward"} · micro-batch ${b.micro_batch}` +
        (sched.vpp > 1 ? ` · chunk ${b.chunk} (virtual stage ${b.chunk * sched.pp + b.stage}` +
          (layers ? `, layers ${(b.chunk * sched.pp + b.stage) * layers}–${(b.chunk * sched.pp + b.stage + 1) * layers - 1}` : "") + ")" : "") +
        `<br>${b.start.toFixed(3)}–${b.end.toFixed(3)} s`),
      hoverinfo: "text+y",
    };
  };
  const idle = idleIntervals(blocks, sched.pp, makespan);
  const traces = [
    { type: "bar", orientation: "h", name: "idle (bubble)", y: idle.map((b) => stageLabel(b.stage)),
      base: idle.map((b) => b.start), x: idle.map((b) => b.end - b.start),
      marker: { color: "rgba(207,34,46,0.13)", line: { color: "rgba(207,34,46,0.35)", width: 0.5 } },
      hovertext: idle.map((b) => `idle ${b.start.toFixed(3)}–${b.end.toFixed(3)} s`), hoverinfo: "text+y" },
    trace("F", "forward", ["#4c78a8", "#7ea3cc", "#2f4b7c", "#a3c4e6"]),
    trace("B", "backward", ["#54a24b", "#88c580", "#2e6b28", "#b5dcae"]),
  ];
  const kind = sched.kind === "interleaved" ? `interleaved 1F1B, ${sched.vpp} chunks per stage` : "1F1B";
  const title = `${kind} · PP ${sched.pp} · ${num(sched.m)} micro-batches` +
    (sched.drawn_micro_batches < sched.m ? ` (first ${sched.drawn_micro_batches} drawn)` : "") +
    ` · bubble ${pct(sched.bubble_fraction)} of compute`;
  const p = draw(container, traces, {
    barmode: "overlay", bargap: 0.25, height: Math.min(620, 120 + 28 * sched.pp),
    title: { text: title, font: { size: 13 }, x: 0.01, xanchor: "left" },
    xaxis: { title: { text: "seconds from the start of the step" }, range: [0, makespan * 1.01 || 1] },
    yaxis: { type: "category", categoryorder: "array",
             categoryarray: Array.from({ length: sched.pp }, (_, s) => stageLabel(s)), autorange: "reversed",
             automargin: true },
    legend: { orientation: "h", x: 1, xanchor: "right", y: 1.0, yanchor: "bottom" },
    margin: { l: 10, r: 20, t: 40, b: 44 },
  });
  note(container, `${sched.note}. Forward ${secs(sched.t_forward)}, backward ${secs(sched.t_backward)} per ` +
    `micro-batch and stage; pipeline p2p (${secs(sched.pp_p2p_s)} per step) is charged separately.`);
  return p;
}

// ----------------------------------------------------------------------------------- view 5: placement

function defaultPlacementKind(pm) {
  const d = pm.degrees;
  return d.ep > 1 ? "ep" : d.pp > 1 ? "pp" : d.tp > 1 ? "tp" : "dp";
}

export function drawPlacement(container, pm) {
  let controls = container.querySelector(":scope > .viz-controls");
  if (!controls) {
    const select = h("select", { class: "placement-kind", "aria-label": "colour devices by" },
      PLACEMENT_KINDS.map(([k, name]) => h("option", { value: k }, name)));
    controls = h("div", { class: "viz-controls inline" }, h("label", {}, "Colour by ", select));
    container.prepend(controls);
    // the user's choice sticks across selections; until then each plan gets its most telling colouring
    select.addEventListener("change", () => { container._pmUser = select.value; container._pmRender(); });
  }
  const select = controls.querySelector("select");
  container._pmKind = container._pmUser || defaultPlacementKind(pm);
  select.value = container._pmKind;

  function render() {
    const kind = container._pmUser || container._pmKind;
    const d = pm.devices;
    const dpn = pm.devices_per_node;
    const nodes = pm.drawn_nodes;
    const values = kind === "pp" ? d.coord.pp : d.group[kind];
    const z = Array.from({ length: dpn }, () => new Array(nodes).fill(null));
    const text = Array.from({ length: dpn }, () => new Array(nodes).fill(""));
    for (let i = 0; i < d.rank.length; i++) {
      const n = d.node[i], l = d.local[i];
      z[l][n] = (values[i] % PALETTE.length) + 0.5;
      text[l][n] = `rank ${d.rank[i]} · node ${n} · device ${l}<br>` +
        `TP ${d.coord.tp[i]} · CP ${d.coord.cp[i]} · DP ${d.coord.dp[i]} · PP stage ${d.coord.pp[i]} · ` +
        `EP ${d.coord.ep[i]}<br>groups: TP ${d.group.tp[i]} · DP ${d.group.dp[i]} · EP ${d.group.ep[i]} · ` +
        `PP ${d.group.pp[i]}`;
    }
    const colorscale = PALETTE.flatMap((c, i) => [[i / PALETTE.length, c], [(i + 1) / PALETTE.length, c]]);
    const traces = [{ type: "heatmap", z, x: Array.from({ length: nodes }, (_, i) => i),
                      y: Array.from({ length: dpn }, (_, i) => i), zmin: 0, zmax: PALETTE.length, colorscale,
                      showscale: false, xgap: 1, ygap: 1, text, hoverinfo: "text" }];
    // switch domains: a boundary line every tier.nodes nodes, for each tier smaller than the drawing
    // switch domains: under the devices, a bracket per switch of each tier (innermost first), and a
    // dark separator through the devices wherever a switch domain ends
    const shapes = [], annotations = [];
    const tiers = pm.tiers || [];
    tiers.forEach((tier, ti) => {
      const count = Math.ceil(nodes / tier.nodes);
      const y = dpn - 0.5 + 0.45 + 0.8 * ti;
      for (let k = 0; k < count; k++) {
        const x0 = k * tier.nodes - 0.5, x1 = Math.min(nodes, (k + 1) * tier.nodes) - 0.5;
        shapes.push({ type: "line", x0: x0 + 0.3, x1: x1 - 0.3, y0: y, y1: y,
                      line: { color: ti ? "#1d2430" : "#6b7585", width: 2 } });
        if (count <= 40) annotations.push({ x: (x0 + x1) / 2, y: y + 0.05, yanchor: "top", text: `${tier.name} ${k}`,
                                            showarrow: false, font: { size: 10, color: "#6b7585" } });
        if (k > 0 && ti === 0) shapes.push({ type: "line", x0, x1: x0, y0: -0.5, y1: dpn - 0.5,
                                             line: { color: "#1d2430", width: 2 } });
      }
    });
    const kindName = PLACEMENT_KINDS.find(([k]) => k === kind)[1];
    const p = draw(container, traces, {
      height: 150 + 24 * dpn + 22 * tiers.length, shapes, annotations,
      title: { text: `${kindName}s on ${pm.num_nodes} nodes × ${dpn} devices (order ${pm.order}, innermost first)`,
               font: { size: 13 }, x: 0.01, xanchor: "left" },
      xaxis: { title: { text: "node" }, zeroline: false, showgrid: false },
      yaxis: { title: { text: "device" }, range: [dpn - 0.5 + 0.8 * tiers.length + 0.4, -0.5], zeroline: false,
               showgrid: false, tickvals: Array.from({ length: dpn }, (_, i) => i) },
      margin: { l: 60, r: 10, t: 52, b: 44 },
    });
    renderLinks();
    return p;
  }

  function renderLinks() {
    let table = container.querySelector(":scope > table.placement-links");
    if (table) table.remove();
    const order = [["tp", "TP"], ["cp", "CP"], ["ep", "EP"], ["edp", "expert DP"], ["dp", "DP (×CP) gradients"],
                   ["pp", "PP"]];
    table = h("table", { class: "placement-links compact" },
      h("thead", {}, h("tr", {}, ["group", "size", "stride", "per node", "spans nodes", "reaches (cost model)",
                                  "actual groups", "link", "GB/s / device"].map((t) => h("th", {}, t)))),
      h("tbody", {}, order.filter(([k]) => pm.links[k]).map(([k, name]) => {
        const l = pm.links[k];
        const actual = Object.entries(l.groups_by_tier || {}).map(([t, n]) => `${n} × ${t}`).join(", ");
        const differs = l.tier !== "none" && l.actual_tier && l.actual_tier !== l.tier;
        return h("tr", { class: differs ? "differs" : null, dataset: { kind: k } },
          h("td", {}, name), h("td", { class: "num" }, num(l.size)), h("td", { class: "num" }, num(l.stride)),
          h("td", { class: "num" }, num(l.per_node)), h("td", { class: "num" }, num(l.span_nodes)),
          h("td", {}, h("span", { class: `tier tier-${l.tier.replace(/\W+/g, "-")}` }, l.tier)),
          h("td", { title: differs ? "the members of the actual groups span a different level than the cost model charges" : null },
            l.size > 1 ? actual : MISSING),
          h("td", {}, l.link || MISSING), h("td", { class: "num" }, num(l.bandwidth_GBps, 1)));
      })));
    container.append(table);
    note(container, pm.note + ". Bandwidth is what the cost model charges per device after collective efficiency " +
      "and oversubscription.");
    container.append(container.querySelector(":scope > .viz-note"));
    renderTraffic();
  }

  // the plan's predicted.placement: bytes per device per step leaving a leaf switch, this placement
  // against the topology-blind one (the default order with the same degrees)
  function renderTraffic() {
    let line = container.querySelector(":scope > .placement-traffic");
    if (line) line.remove();
    const t = pm.traffic;
    if (!t) return;
    const blind = t.topology_blind || {};
    const text = t.note && !blind.cross_switch_GB_per_step
      ? `Cross-switch traffic: none (${t.note}).`
      : `Cross-switch traffic: ${num(t.cross_switch_GB_per_step, 3)} GB per device per step (order ${t.order}) ` +
        `vs ${num(blind.cross_switch_GB_per_step, 3)} GB topology-blind (order ${blind.order}, ` +
        `${num(blind.step_time_s, 2)} s/step): ${num(t.saving_pct, 1)} % less.`;
    line = h("p", { class: "placement-traffic" }, text);
    container.append(line);
  }

  container._pmRender = render;
  return render();
}

// ------------------------------------------------------------------------ view 6: plan diff (charts)

export function drawDiffCharts(container, a, b, labels = ["A", "B"]) {
  const ma = memoryOf(a), mb = memoryOf(b);
  const sa = stepOf(a), sb = stepOf(b);
  const traces = [];
  MEMORY_PARTS.forEach(([k, name, color]) => traces.push({
    type: "bar", orientation: "h", name, y: labels, marker: { color }, xaxis: "x", yaxis: "y", legendgroup: "mem",
    x: [ma, mb].map((m) => (k === "other" ? m.other : m.parts[k])), hovertemplate: `${name}: %{x:.2f} GiB<extra>%{y}</extra>`,
  }));
  STEP_PARTS.forEach(([k, name, color]) => traces.push({
    type: "bar", orientation: "h", name, y: labels, marker: { color }, xaxis: "x2", yaxis: "y2", legendgroup: "step",
    x: [sa, sb].map((s) => s.parts[k]), hovertemplate: `${name}: %{x:.3f} s<extra>%{y}</extra>`,
  }));
  const cap = ma.capacity || mb.capacity;
  const shapes = cap ? [{ type: "line", x0: cap, x1: cap, xref: "x", yref: "y domain", y0: 0, y1: 1,
                          line: { color: "#cf222e", width: 2, dash: "dash" } }] : [];
  return draw(container, traces, {
    barmode: "stack", height: 420, shapes,
    xaxis: { title: { text: "memory, GiB per device" }, anchor: "y", domain: [0, 1],
             range: [0, Math.max(cap || 0, ma.total, mb.total) * 1.08 || 1] },
    yaxis: { domain: [0.62, 1], autorange: "reversed" },
    xaxis2: { title: { text: "step time, s" }, anchor: "y2", domain: [0, 1] },
    yaxis2: { domain: [0, 0.36], autorange: "reversed" },
    legend: { orientation: "v", x: 1.02, y: 1, font: { size: 11 }, traceorder: "normal" },
    margin: { l: 10 + 6.5 * Math.max(...labels.map((l) => l.length)), r: 10, t: 20, b: 40 },
  });
}

const FIGURES = [["step_time_s", "step time (s)", 3], ["tokens_per_s", "tokens/s", 0], ["mfu", "MFU", 3],
                 ["model_tflops_per_device", "model TFLOP/s per device", 1],
                 ["hardware_tflops_per_device", "hardware TFLOP/s per device", 1],
                 ["memory_GiB_per_device.total", "memory per device (GiB)", 2],
                 ["memory_GiB_per_device.params", "· params (GiB)", 2], ["memory_GiB_per_device.grads", "· grads (GiB)", 2],
                 ["memory_GiB_per_device.optimizer", "· optimizer (GiB)", 2],
                 ["memory_GiB_per_device.activations", "· activations (GiB)", 2],
                 ["memory_headroom_GiB", "memory headroom (GiB)", 2], ["bubble_fraction", "bubble fraction", 4],
                 ["exposed_comm_s", "exposed communication (s)", 3], ["comm_s.tp", "· TP comm (s)", 3],
                 ["comm_s.pp", "· PP comm (s)", 3], ["comm_s.dp", "· DP comm (s)", 3], ["comm_s.ep", "· EP comm (s)", 3],
                 ["comm_s.cp", "· CP comm (s)", 3], ["compute_s", "compute (s)", 3], ["bubble_s", "bubble (s)", 3],
                 ["optimizer_s", "optimizer (s)", 3], ["num_micro_batches", "micro-batches per replica", 0],
                 ["comm_volume_GB_per_device", "communication volume (GB/device)", 1],
                 ["scaling_efficiency", "scaling efficiency", 3],
                 ["energy.watts_per_device", "power per device (W, predicted)", 0],
                 ["energy.kwh_per_1m_tokens", "kWh per 1M tokens (IT, predicted)", 3],
                 ["energy.tokens_per_kwh", "tokens per kWh (IT, predicted)", 0]];

function dig(obj, path) { return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj); }

// a plan's scaling efficiency, or "not computed" (null: its baseline was never costed; never shown as 1.000)
export function scalingText(predicted) {
  const s = predicted?.scaling_efficiency;
  return s == null ? "not computed" : num(s, 3);
}

export function diffTable(a, b, labels = ["A", "B"]) {
  const rows = [];
  const row = (name, va, vb, fa, fb, field) => {
    const differs = String(va) !== String(vb);
    rows.push(h("tr", { class: differs ? "differs" : null, dataset: { field } }, h("th", {}, name),
      h("td", { class: "num" }, fa), h("td", { class: "num" }, fb)));
  };
  rows.push(h("tr", { class: "section" }, h("th", { colspan: 3 }, "strategy")));
  for (const k of [...STRATEGY_FIELDS, "order"]) {
    const va = k === "order" ? (a.strategy.order || DEFAULT_ORDER) : a.strategy[k];
    const vb = k === "order" ? (b.strategy.order || DEFAULT_ORDER) : b.strategy[k];
    row(k, va, vb, String(va), String(vb), `strategy.${k}`);
  }
  rows.push(h("tr", { class: "section" }, h("th", { colspan: 3 }, "predicted")));
  for (const [path, name, d] of FIGURES) {
    const va = dig(a.predicted, path), vb = dig(b.predicted, path);
    if (va === undefined && vb === undefined) continue;
    // null: the planner did not compute it (e.g. scaling efficiency without its baseline)
    const shown = (v) => (v === null ? "not computed" : num(v, d));
    row(name, va == null ? "" : Number(va).toFixed(d), vb == null ? "" : Number(vb).toFixed(d),
        shown(va), shown(vb), `predicted.${path}`);
  }
  if (a.measured || b.measured) {
    rows.push(h("tr", { class: "section" }, h("th", { colspan: 3 }, "measured")));
    for (const [path, name, d] of FIGURES.slice(0, 6)) {
      const va = dig(a.measured, path), vb = dig(b.measured, path);
      if (va == null && vb == null) continue;
      row(name, va, vb, num(va, d), num(vb, d), `measured.${path}`);
    }
  }
  return h("table", { class: "diff-table compact" },
    h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", { class: "num" }, labels[0]), h("th", { class: "num" }, labels[1]))),
    h("tbody", {}, rows));
}

export async function drawDiff(container, a, b, labels, link) {
  let holder = container.querySelector(":scope > .diff-holder");
  if (!holder) { holder = h("div", { class: "diff-holder viz-cols" }); container.append(holder); }
  holder.replaceChildren(h("div", { class: "diff-strategies" },
    h("p", {}, h("b", {}, labels[0]), ": ", strategyText(a.strategy)),
    h("p", {}, h("b", {}, labels[1]), ": ", strategyText(b.strategy)),
    link ? h("p", {}, h("a", { href: link, class: "diff-link" }, "open the full diff page →")) : null,
    diffTable(a, b, labels)));
  return drawDiffCharts(container, a, b, labels);
}

// ------------------------------------------------------------------------------------ view 1: Pareto

export function drawPareto(container, data, selectedStrategy, onPick) {
  const cands = data.candidates || [];
  const plans = (data.plans || []).filter((p) => p.feasible !== false && p.predicted);
  const pareto = plans.filter((p) => p.in_pareto)
    .sort((x, y) => x.predicted.memory_GiB_per_device.total - y.predicted.memory_GiB_per_device.total);
  const best = plans.find((p) => p.id === data.best_plan_id) || plans.find((p) => p.rank === 1);
  const maxShare = Math.max(0.05, ...cands.map((c) => c.comm_share || 0));
  const pick = []; // per trace: the strategies its points stand for
  const traces = [];
  traces.push({
    type: "scatter", mode: "markers", name: `feasible candidates (${num(cands.length)} shown)`,
    x: cands.map((c) => c.memory_GiB), y: cands.map((c) => c.tokens_per_s),
    text: cands.map((c) => strategyText(c.strategy)), customdata: cands.map((c) => c.comm_share),
    marker: { size: 7, color: cands.map((c) => c.comm_share), colorscale: "Viridis", cmin: 0, cmax: maxShare,
              opacity: 0.8, line: { width: 0 },
              colorbar: { title: { text: "exposed comm<br>/ step time", side: "right" }, tickformat: ".0%", thickness: 12 } },
    hovertemplate: "%{text}<br>%{y:,.0f} tokens/s · %{x:.1f} GiB/device · comm %{customdata:.1%}<extra></extra>",
  });
  pick.push(cands.map((c) => c.strategy));
  const pt = (p) => ({ x: p.predicted.memory_GiB_per_device.total, y: p.predicted.tokens_per_s });
  traces.push({
    type: "scatter", mode: "markers", name: "Pareto plans (tokens/s, headroom, comm volume)",
    x: pareto.map((p) => pt(p).x), y: pareto.map((p) => pt(p).y), text: pareto.map((p) => strategyText(p.strategy)),
    marker: { size: 9, color: "rgba(0,0,0,0)", line: { color: "#1d2430", width: 1.5 } },
    hovertemplate: "Pareto: %{text}<br>%{y:,.0f} tokens/s · %{x:.1f} GiB/device<extra></extra>",
  });
  pick.push(pareto.map((p) => p.strategy));
  // the throughput-memory frontier of what is drawn: the most tokens/s at or below each memory
  const frontier = [];
  [...cands.map((c) => [c.memory_GiB, c.tokens_per_s]), ...pareto.map((p) => [pt(p).x, pt(p).y])]
    .sort((u, v) => u[0] - v[0])
    .forEach(([x, y]) => { if (!frontier.length || y > frontier[frontier.length - 1][1]) frontier.push([x, y]); });
  traces.push({
    type: "scatter", mode: "lines", name: "best throughput for the memory", x: frontier.map((f) => f[0]),
    y: frontier.map((f) => f[1]), line: { color: "rgba(199,0,11,0.55)", width: 1.5, shape: "hv" }, hoverinfo: "skip",
  });
  pick.push([]);
  traces.push({
    type: "scatter", mode: "markers", name: "best plan", x: best ? [pt(best).x] : [], y: best ? [pt(best).y] : [],
    text: best ? [strategyText(best.strategy)] : [],
    marker: { symbol: "star", size: 18, color: "#c7000b", line: { color: "#fff", width: 1 } },
    hovertemplate: "best: %{text}<br>%{y:,.0f} tokens/s · %{x:.1f} GiB/device<extra></extra>",
  });
  pick.push(best ? [best.strategy] : []);
  const sel = selectedStrategy ? findPoint(data, selectedStrategy) : null;
  traces.push({
    type: "scatter", mode: "markers", name: "selected", x: sel ? [sel.x] : [], y: sel ? [sel.y] : [],
    hoverinfo: "skip", marker: { symbol: "circle-open", size: 22, color: "#c7000b", line: { width: 3 } },
  });
  pick.push([]);
  const cap = data.cluster && data.cluster.device ? data.cluster.device.memory_GiB : null;
  const shapes = cap ? [{ type: "line", x0: cap, x1: cap, yref: "paper", y0: 0, y1: 1,
                          line: { color: "#cf222e", width: 1.5, dash: "dash" } }] : [];
  const annotations = cap ? [{ x: cap, yref: "paper", y: 1, text: `device memory ${cap} GiB`, showarrow: false,
                               xanchor: "right", yanchor: "bottom", font: { color: "#cf222e", size: 11 } }] : [];
  const p = draw(container, traces, {
    height: 470, shapes, annotations, hovermode: "closest", clickmode: "event",
    xaxis: { title: { text: "memory per device (GiB)" } },
    yaxis: { title: { text: "throughput (tokens/s)" }, tickformat: ",.0f" },
    legend: { orientation: "h", y: -0.18 }, margin: { l: 70, r: 10, t: 30, b: 60 },
  });
  return p.then((div) => {
    div._pick = pick;
    if (!div._pickBound) {
      div._pickBound = true;
      div.on("plotly_click", (ev) => {
        const point = ev && ev.points && ev.points[0];
        if (!point) return;
        const list = div._pick[point.curveNumber] || [];
        const idx = point.pointIndex != null ? point.pointIndex : point.pointNumber;
        const strategy = list[idx];
        if (strategy) div._onPick(strategy);
      });
    }
    div._onPick = onPick;
    return div;
  });
}

function findPoint(data, strategy) {
  const c = (data.candidates || []).find((x) => sameStrategy(x.strategy, strategy));
  if (c) return { x: c.memory_GiB, y: c.tokens_per_s };
  const p = (data.plans || []).find((x) => x.predicted && sameStrategy(x.strategy, strategy));
  if (p) return { x: p.predicted.memory_GiB_per_device.total, y: p.predicted.tokens_per_s };
  return null;
}


// ------------------------------------------------------------------- plan page: predicted vs measured

const MEASURED = [["step_time_s", "step time (s)", 3], ["tokens_per_s", "tokens/s", 0], ["mfu", "MFU", 3],
                  ["model_tflops_per_device", "model TFLOP/s per device", 1],
                  ["memory_GiB_per_device.total", "memory per device (GiB)", 2], ["bubble_fraction", "bubble fraction", 3],
                  ["exposed_comm_s", "exposed communication (s)", 3], ["comm_share", "communication share", 3]];

export function drawMeasured(container, plan) {
  const rows = MEASURED.map(([path, name, d]) => {
    const pv = dig(plan.predicted, path);
    const mv = plan.measured ? dig(plan.measured, path) : null;
    const err = pv && mv != null ? mv / pv - 1 : null;
    return { path, name, d, pv, mv, err };
  }).filter((r) => r.pv != null || r.mv != null);
  container.querySelector(".measured-table")?.remove();
  container.querySelector(".prediction-caveat")?.remove();
  // measured / predicted as every page writes it (common.js formatVsPredicted)
  container.prepend(h("table", { class: "measured-table compact" },
    h("thead", {}, h("tr", {}, ["", "predicted", "measured", "measured / predicted"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows.map((r) => h("tr", { dataset: { field: r.path } }, h("th", {}, r.name),
      h("td", { class: "num" }, num(r.pv, r.d)), h("td", { class: "num" }, num(r.mv, r.d)),
      h("td", { class: `num ${r.err != null && Math.abs(r.err) > 0.15 ? "bad" : ""}`,
                dataset: r.err != null ? { value: 1 + r.err } : {} },
        formatVsPredicted(r.mv, r.pv)))))));
  const caveat = predictionCaveat(plan.predicted);
  if (caveat) {
    container.prepend(h("p", { class: "prediction-caveat caveat" },
      `Predicted figures ${caveat}: the planner used the shipped placeholder profile for this cpu, not one measured on it.`));
  }
  const withBoth = rows.filter((r) => r.err != null);
  if (!withBoth.length) {
    note(container, plan.measured ? "The measurement holds none of the predicted figures." :
      "Not measured yet: launch the plan, or import a published run, to compare.");
    return Promise.resolve(null);
  }
  return draw(container, [
    { type: "bar", name: "predicted", x: withBoth.map((r) => r.name), y: withBoth.map(() => 100), marker: { color: "#bab0ac" },
      text: withBoth.map((r) => num(r.pv, r.d)), hovertemplate: "predicted %{text}<extra>%{x}</extra>" },
    { type: "bar", name: "measured", x: withBoth.map((r) => r.name), y: withBoth.map((r) => 100 * (1 + r.err)),
      marker: { color: "#4c78a8" }, text: withBoth.map((r) => num(r.mv, r.d)),
      hovertemplate: "measured %{text} (%{y:.0f}% of predicted)<extra>%{x}</extra>" },
  ], { barmode: "group", height: 320, yaxis: { title: { text: "% of predicted" } }, legend: { orientation: "h", y: -0.3 } });
}

// ------------------------------------------------------------------------------------ view 7: what-if

// entries: [{label, plan, devices}], the first the baseline every other bar is a percentage of
export function drawWhatIf(container, entries) {
  const metrics = [["tokens/s", (p) => p.tokens_per_s, (v) => num(v)],
                   ["tokens/s per device", (p, e) => p.tokens_per_s / e.devices, (v) => num(v)],
                   ["step time", (p) => p.step_time_s, secs],
                   ["memory per device", (p) => p.memory_GiB_per_device.total, (v) => formatGiB(v, 1)],
                   ["exposed comm", (p) => p.exposed_comm_s, secs], ["MFU", (p) => p.mfu, (v) => pct(v)]];
  const base = entries[0];
  const traces = entries.map((e, i) => ({
    type: "bar", orientation: "h", name: e.label, y: metrics.map(([n]) => n),
    x: metrics.map(([, f]) => { const b = f(base.plan.predicted, base); return b ? 100 * f(e.plan.predicted, e) / b : 0; }),
    text: metrics.map(([, f, format]) => format(f(e.plan.predicted, e))),
    textposition: "auto", marker: { color: PALETTE[i % PALETTE.length] },
    hovertemplate: `${e.label}: %{text} (%{x:.0f}% of ${base.label})<extra>%{y}</extra>`,
  }));
  return draw(container, traces, {
    barmode: "group", height: 150 + 42 * metrics.length * Math.min(entries.length, 3) / 1.6,
    xaxis: { title: { text: `% of ${base.label}` } }, yaxis: { autorange: "reversed", automargin: true },
    legend: { orientation: "h", y: -0.2 }, margin: { l: 10, r: 20, t: 20, b: 60 },
    shapes: [{ type: "line", x0: 100, x1: 100, yref: "paper", y0: 0, y1: 1, line: { color: "#6b7585", dash: "dot" } }],
  });
}
