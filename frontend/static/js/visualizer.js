// Strategy visualizer, the page controllers: what each planner page shows when, drawn with the views of
// visualizer_charts.js from what workers/planner/visual.py computed.
//
// Pages: initSearchPage() (planning/search_detail.html), initPlanPage() (plan_detail.html) and
// initDiffPage() (plan_diff.html). Each reads the JSON the view embedded with json_script("viz-data"); the
// search page's holds only its header (planning.selectors.search_page_header): it fetches the views' data
// from GET /api/searches/<id>/page-data/ once it has painted, and again when the search ends.
import { bindLaunchOptions, launchOptions, showLaunchErrors } from "./launch_options.js";
import { LiveClient } from "./live.js";
import {
  MISSING, failureLines, formatGiB, formatNumber as num, formatPercent as pct, formatSeconds as secs, getJSON, h,
  postJSON,
} from "./common.js";
import {
  diffTable, drawDiff, drawDiffCharts, drawMeasured, drawMemory, drawPareto, drawPlacement, drawSchedule,
  drawStepTime, drawWhatIf, memoryOf, sameStrategy, scalingText, stepOf, strategyText,
} from "./visualizer_charts.js";

const TERMINAL = ["succeeded", "failed", "cancelled"];
const terminal = (s) => TERMINAL.includes(s);
// how often the search page polls the search while its websocket is not open
const POLL_MS = 3000;

export function readData(id = "viz-data") {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}

// the state badge of the search page's header, from the page's data
function showState(state) {
  const badge = document.getElementById("search-state");
  if (badge) {
    badge.textContent = state;
    badge.className = `state ${state}`;
    badge.dataset.state = state;
  }
  document.body.classList.toggle("search-done", terminal(state));
}

// ------------------------------------------------------------------------------------ the search page

function planLabel(plan, fallback) {
  if (!plan) return fallback;
  if (plan.rank) return `#${plan.rank}`;
  return plan.name || fallback;
}

// The one state the search page shows — in the header badge, the bar and the text alike: the page data's
// once the search ended (the server's word is final), else the newest live report (a progress or end event
// of the websocket, or the poll) over the page data.
export function progressView(search, live = {}) {
  const ended = terminal(search.state);
  const state = ended ? search.state : live.state || search.state;
  const stats = search.stats || {};
  const current = (key) => (!ended && live[key] != null ? live[key] : stats[key]);
  let fraction = ended ? search.progress || 0 : live.fraction != null ? live.fraction : search.progress || 0;
  if (state === "succeeded") fraction = 1;
  fraction = Math.max(0, Math.min(1, fraction));
  const rejected = stats.rejected && terminal(state) ? Object.values(stats.rejected).reduce((a, n) => a + n, 0) : null;
  return { state, fraction, evaluated: current("evaluated"), feasible: current("feasible"), rejected,
           done: terminal(state), best: ended ? null : live.best };
}

function renderProgress(root, search, live) {
  const v = progressView(search, live);
  const { state, fraction: f } = v;
  const stats = search.stats || {};
  showState(state);
  root.dataset.state = state;
  root.dataset.fraction = String(f);
  const bar = root.querySelector(".bar");
  bar.hidden = state === "failed";  // a failed search did not get "45% done": it has no plan at all
  bar.querySelector("span").style.width = `${(100 * f).toFixed(1)}%`;
  bar.setAttribute("aria-valuenow", String(Math.round(100 * f)));
  let text;
  if (state === "failed" || (state === "cancelled" && !v.feasible)) {
    text = state + (v.rejected != null ? ` · ${num(v.rejected)} layouts rejected` : "") +
      (v.evaluated ? ` (${num(v.evaluated)} passed the divisibility rules and were costed; none fits)` : "") +
      (stats.seconds != null ? ` · ${secs(stats.seconds)}` : "");
  } else {
    text = `${state} · ${pct(f, 0)}` +
      (v.evaluated != null ? ` · ${num(v.evaluated)} layouts evaluated` : "") +
      (v.feasible != null ? `, ${num(v.feasible)} fit` : "") +
      (stats.seconds != null && v.done ? ` · ${num(stats.seconds, 2)} s` : "") +
      (stats.pareto_size != null && v.done ? ` · Pareto front ${num(stats.pareto_size)}` : "");
  }
  root.querySelector(".progress-text").textContent = text;
  const bestNode = root.querySelector(".best-so-far");
  const best = v.best;
  bestNode.textContent = best && best.predicted
    ? `best so far: ${strategyText(best.strategy)} — ${num(best.predicted.tokens_per_s)} tokens/s, ` +
      `step ${secs(best.predicted.step_time_s)}, ${formatGiB(best.predicted.memory_GiB_per_device.total, 1)}/device`
    : "";
  const rejected = root.querySelector(".rejected");
  rejected.textContent = stats.rejected && v.done && Object.keys(stats.rejected).length
    ? "rejected: " + Object.entries(stats.rejected).map(([r, n]) => `${r}: ${num(n)}`).join("; ") : "";
  const cancel = document.getElementById("cancel-search");
  if (cancel && v.done) cancel.hidden = true;
  root.dataset.ready = "1";
  return v;
}

// A search that ended without a plan: the seven views and their controls go away, and one message says
// why and what to change (the planner's tightest constraint names the change: a batch, nodes, TP/PP).
function renderOutcome(data, hasPlan) {
  const views = document.getElementById("viz-views");
  const box = document.getElementById("search-outcome");
  const s = data.search;
  const noPlan = terminal(s.state) && !hasPlan;
  if (views) views.hidden = noPlan;
  if (!box) return;
  box.hidden = !noPlan;
  if (!noPlan) return;
  const stats = s.stats || {};
  const message = s.human_readable_error || stats.tightest ||
    (s.state === "cancelled" ? "The search was cancelled before any layout was found to fit." : "The search found no plan.");
  // the planner's tightest constraint ends with the change it suggests ("… — add nodes or raise TP/PP")
  const [why, suggestion] = message.split(" — ");
  const change = suggestion ? `What to change: ${suggestion}.`
    : stats.tightest ? "What to change: unpin strategy fields, or pick a model or cluster whose shapes the rejections above allow."
    : s.state === "cancelled" ? "Start the search again and let it finish." : "Retry the search; if it fails again, report it with the message above.";
  box.querySelector(".outcome-message").textContent = why;
  box.querySelector(".outcome-change").textContent = change;
  box.dataset.state = s.state;
}

export async function initSearchPage() {
  let data = readData();  // the header's data; the views' data follows
  const state = { selected: null, live: {} };
  const progress = document.getElementById("search-progress");
  const views = Object.fromEntries(["pareto", "memory", "steptime", "schedule", "placement", "diff", "whatif"]
    .map((k) => [k, document.getElementById(`view-${k}`)]));
  const selection = document.getElementById("selection");
  const status = (text, cls = "muted") => { if (selection) { const s = selection.querySelector(".selection-status");
    s.textContent = text; s.className = `selection-status ${cls}`; } };
  window.__viz = { state, get data() { return data; }, progress: [] };

  const bestPlan = () => (data.plans || []).find((p) => p.id === data.best_plan_id) ||
    (data.plans || []).find((p) => p.rank === 1) || null;
  const secondPlan = () => (data.plans || []).filter((p) => p.rank).sort((a, b) => a.rank - b.rank)[1] || null;

  function runnerUpFor(strategy) {
    const best = bestPlan();
    if (best && !sameStrategy(best.strategy, strategy)) return { plan: best, label: "best plan" };
    const second = secondPlan();
    return second ? { plan: second, label: "runner-up (#2)" } : null;
  }

  async function showSelection(plan, visuals, label) {
    state.selected = { plan, visuals, label };
    const cap = data.cluster.device.memory_GiB;
    const ru = runnerUpFor(plan.strategy);
    const entries = [{ label, memory: visuals ? visuals.memory : memoryOf(plan), plan }];
    if (ru) entries.push({ label: ru.label, memory: memoryOf(ru.plan), plan: ru.plan });
    const stepEntries = [{ label, step: visuals ? visuals.step_time : stepOf(plan) }];
    if (ru) stepEntries.push({ label: ru.label, step: stepOf(ru.plan) });
    const jobs = [drawMemory(views.memory, entries, cap), drawStepTime(views.steptime, stepEntries)];
    if (visuals) jobs.push(drawSchedule(views.schedule, visuals.schedule), drawPlacement(views.placement, visuals.placement));
    jobs.push(drawPareto(views.pareto, data, plan.strategy, pick));
    await Promise.all(jobs);
    if (selection) {
      const p = plan.predicted;
      selection.querySelector(".selection-text").replaceChildren(
        h("b", {}, label), ": ", strategyText(plan.strategy), h("br"),
        `${num(p.tokens_per_s)} tokens/s · step ${secs(p.step_time_s)} · MFU ${pct(p.mfu)} · ` +
        `${formatGiB(p.memory_GiB_per_device.total, 1)}/device · bubble ${pct(p.bubble_fraction)} · ` +
        `exposed comm ${secs(p.exposed_comm_s)} · scaling efficiency ${scalingText(p)}` +
        (p.idle_note ? ` · ${p.idle_note}` : "") +
        (p.moe_imbalance ? ` · MoE imbalance ${p.moe_imbalance.value.toFixed(3)} (${p.moe_imbalance.method})` : "") +
        (p.correction ? ` · ${p.correction.summary}` : "") +
        (p.efficiency_profile?.achievable_compute ? ` · compute ceiling ${pct(p.efficiency_profile.achievable_compute.gemm_max)} ` +
          `of peak (matmul ${pct(p.efficiency_profile.achievable_compute.matmul_fraction_of_peak)}, ` +
          `${p.efficiency_profile.achievable_compute.confidence})` : "") +
        (p.zero3_collectives ? ` · ZeRO-3 gathers: ${p.zero3_collectives.framework}, ` +
          `${p.zero3_collectives.zero3_inter_node === "ring" ? "rings over the node's NICs" : "each rank's own NIC"}, ` +
          `per ${p.zero3_collectives.zero3_unit}` : "") +
        (p.energy?.tokens_per_kwh != null ? ` · ${num(p.energy.tokens_per_kwh)} tokens/kWh, ` +
          `${num(p.energy.watts_per_device)} W/device (predicted)` : "") +
        (plan.feasible === false ? ` · infeasible: ${plan.reason}` : ""),
        h("br"), selectionActions(plan));
      selection.dataset.strategy = strategyText(plan.strategy);
      selection.dataset.planId = plan.id || "";
    }
    status("");
  }

  // What can be done with the selected point: a stored plan opens and launches; a point the search did not
  // store (most of the Pareto view: the page costed it just now) is saved first, into this search's team.
  function selectionActions(plan) {
    const actions = h("span", { class: "selection-actions inline" });
    const launch = (stored) => h("button", { type: "button", class: "launch-selected", onclick: async (ev) => {
      const button = ev.currentTarget;
      button.disabled = true;
      status("launching…");
      const r = await postJSON(data.urls.launch, { name: stored.name || strategyText(stored.strategy), plan_id: stored.id,
                                                   steps: 20, profile_every: 5 });
      if (r.status === 201 && r.body && r.body.id != null) { location.assign(data.urls.job_page.replace("{id}", r.body.id)); return; }
      button.disabled = false;
      status(`launch refused: ${failureLines(r, "no answer").join("; ")}`, "error");
    } }, "Launch");
    const stored = (p) => [h("a", { href: data.urls.plan_page.replace("{id}", p.id), class: "open-selected" }, `Open plan #${p.id}`),
                           launch(p)];
    if (plan.id) { actions.append(...stored(plan)); return actions; }
    if (plan.feasible === false) { actions.append(h("span", { class: "muted" }, "does not fit: nothing to save")); return actions; }
    const save = h("button", { type: "button", class: "save-selected", onclick: async () => {
      save.disabled = true;
      status("saving…");
      const r = await postJSON(data.urls.save_plan, { strategy: plan.strategy });
      if (!r.ok || !r.body || r.body.id == null) {
        save.disabled = false;
        status(`not saved: ${failureLines(r, "no answer").join("; ")}`, "error");
        return;
      }
      const saved = r.body;
      if (!(data.plans || []).some((x) => x.id === saved.id)) {
        data.plans = [...(data.plans || []), { ...saved, name: saved.name || strategyText(saved.strategy) }];
        renderPlanTable();
      }
      plan.id = saved.id;
      actions.replaceChildren(h("span", { class: "ok" }, `saved as plan #${saved.id}`), " · ", ...stored(saved));
      selection.dataset.planId = saved.id;
      status("");
    } }, "Save as plan");
    actions.append(save, h("span", { class: "muted" }, "not stored by the search: save it to open or launch it"));
    return actions;
  }

  async function pick(strategy, label = "selected") {
    status("evaluating…");
    const r = await postJSON(data.urls.evaluate, { model: data.model, cluster: data.cluster, training: data.training,
                                                   strategy });
    if (!r.ok) { status(`evaluation failed: ${failureLines(r, "no answer").join("; ")}`, "error"); return; }
    const stored = (data.plans || []).find((p) => sameStrategy(p.strategy, strategy));
    const plan = stored ? { ...r.body.plan, id: stored.id, rank: stored.rank } : r.body.plan;
    await showSelection(plan, r.body.visuals, stored && stored.rank ? `#${stored.rank} (selected)` : label);
  }

  function renderPlanTable() {
    const root = document.getElementById("plan-table");
    if (!root) return;
    // sort: the search's rank (fastest first), or highest tokens/s, or highest predicted tokens/kWh
    // (predicted.energy, workers/planner/energy.py; plans without it go last)
    const sortBy = root.dataset.sort || "rank";
    const tps = (p) => p.predicted?.tokens_per_s || 0;
    const tpk = (p) => p.predicted?.energy?.tokens_per_kwh ?? -1;
    const order = {
      rank: (a, b) => (a.rank || 1e9) - (b.rank || 1e9) || tps(b) - tps(a),
      tokens_per_s: (a, b) => tps(b) - tps(a) || (a.rank || 1e9) - (b.rank || 1e9),
      tokens_per_kwh: (a, b) => tpk(b) - tpk(a) || tps(b) - tps(a),
    }[sortBy] || ((a, b) => (a.rank || 1e9) - (b.rank || 1e9));
    const plans = (data.plans || []).slice().sort(order);
    const limit = root.dataset.all ? plans.length : 30;
    const body = h("tbody", {}, plans.slice(0, limit).map((p) => {
      const pr = p.predicted || {};
      return h("tr", { dataset: { planId: p.id }, class: p.id === data.best_plan_id ? "best" : null },
        h("td", {}, h("input", { type: "checkbox", class: "diff-pick", value: p.id, "aria-label": `compare plan ${p.id}` })),
        h("td", {}, p.rank ? `#${p.rank}` : MISSING),
        h("td", {}, h("a", { href: "#", class: "pick-plan", onclick: (e) => { e.preventDefault();
          pick(p.strategy, planLabel(p, `plan ${p.id}`)); } }, strategyText(p.strategy))),
        h("td", { class: "num" }, num(pr.tokens_per_s)),
        h("td", { class: "num tokens-per-kwh", title: pr.energy?.unavailable || null }, num(pr.energy?.tokens_per_kwh)),
        h("td", { class: "num" }, num(pr.step_time_s, 3)),
        h("td", { class: "num" }, pct(pr.mfu)), h("td", { class: "num" }, num(pr.memory_GiB_per_device?.total, 1)),
        h("td", { class: "num" }, pct(pr.bubble_fraction)), h("td", { class: "num" }, num(pr.exposed_comm_s, 3)),
        h("td", {}, p.in_pareto ? "✓" : ""), h("td", {}, p.source || ""),
        h("td", {}, h("a", { href: data.urls.plan_page.replace("{id}", p.id) }, "open")));
    }));
    const compare = h("button", { type: "button", class: "compare" }, "Compare the two checked");
    const more = plans.length > limit ? h("button", { type: "button", class: "link", onclick: () => {
      root.dataset.all = "1"; renderPlanTable(); } }, `show all ${plans.length}`) : null;
    const sort = h("select", { class: "plan-sort", "aria-label": "sort plans by", onchange: (e) => {
      root.dataset.sort = e.target.value; renderPlanTable(); } },
      [["rank", "rank (fastest first)"], ["tokens_per_s", "tokens/s"], ["tokens_per_kwh", "tokens/kWh (predicted)"]]
        .map(([v, t]) => h("option", { value: v, selected: v === sortBy }, t)));
    root.replaceChildren(
      h("div", { class: "inline" }, h("label", {}, "sort by ", sort)),
      h("table", { class: "compact" }, h("thead", {}, h("tr", {}, ["diff", "rank", "strategy", "tokens/s", "tokens/kWh",
        "step s", "MFU", "mem GiB", "bubble", "exp. comm s", "Pareto", "source", ""].map((t) => h("th", {}, t)))), body),
      h("div", { class: "inline" }, compare, more, h("span", { class: "muted compare-hint" },
        "check two plans to compare them in the diff view")));
    compare.addEventListener("click", () => {
      const ids = [...root.querySelectorAll("input.diff-pick:checked")].map((i) => Number(i.value));
      if (ids.length !== 2) { root.querySelector(".compare-hint").textContent = "check exactly two plans"; return; }
      const [a, b] = ids.map((id) => data.plans.find((p) => p.id === id));
      drawDiff(views.diff, a, b, [planLabel(a, `plan ${a.id}`), planLabel(b, `plan ${b.id}`)],
               data.urls.diff.replace("{a}", a.id).replace("{b}", b.id));
      views.diff.scrollIntoView({ behavior: "smooth", block: "start" });
    });
    root.dataset.ready = "1";
  }

  function renderSimilar() {
    const root = document.getElementById("similar-plans");
    if (!root) return;
    const rows = data.similar_plans || [];
    if (!rows.length) { root.replaceChildren(h("p", { class: "muted" }, "No similar plans in the knowledge base yet.")); }
    else {
      root.replaceChildren(h("table", { class: "compact" },
        h("thead", {}, h("tr", {}, ["plan", "model", "cluster", "devices", "strategy", "predicted tokens/s",
          "measured tokens/s", "here (re-evaluated)", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows.map((s) => {
          const re = s.reevaluated;
          return h("tr", { dataset: { planId: s.id } },
            h("td", {}, h("a", { href: data.urls.plan_page.replace("{id}", s.id) }, s.name || `plan ${s.id}`)),
            h("td", {}, s.model_name || MISSING), h("td", {}, s.cluster_name || MISSING),
            h("td", { class: "num" }, num(s.device_count)),
            h("td", {}, strategyText(s.strategy)), h("td", { class: "num" }, num(s.predicted?.tokens_per_s)),
            h("td", { class: "num" }, num(s.measured?.tokens_per_s)),
            h("td", { class: "num" }, re ? (re.feasible ? `${num(re.predicted.tokens_per_s)} tokens/s` : `does not fit: ${re.reason}`)
              : h("span", { class: "muted" }, "not applicable")),
            h("td", {}, re && re.feasible ? h("button", { type: "button", class: "link", onclick: () =>
              pick(re.strategy, `similar: ${s.name || s.id}`) }, "show") : ""));
        }))));
    }
    root.dataset.ready = "1";
  }

  function renderWhatIf() {
    const root = views.whatif;
    if (!root) return;
    const form = root.querySelector("form.what-if");
    const input = form.querySelector("input[name=lose_nodes]");
    const c = data.cluster;
    input.max = String(Math.max(1, c.num_nodes - 1));
    if (!input.value) input.value = String(Math.min(Math.max(1, c.num_nodes - 1),
      (c.tiers && c.tiers[0] && c.tiers[0].nodes < c.num_nodes) ? c.tiers[0].nodes : 1));
    if (!form._bound) {
      form._bound = true;
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const out = form.querySelector(".what-if-status");
        out.className = "what-if-status muted"; out.textContent = "starting the search…";
        const r = await postJSON(data.urls.what_if, { lose_nodes: Number(input.value) });
        if (r.status === 201 && r.body && r.body.url) { location.assign(r.body.url); return; }
        out.className = "what-if-status error";
        out.textContent = failureLines(r).join("; ");
      });
    }
    const best = bestPlan();
    const parent = data.parent_best;
    const devices = c.num_nodes * c.devices_per_node;
    const lost = data.search.what_if ? data.search.what_if.lose_nodes : 0;
    // the parent's size: its best plan's device count (this search's cluster may be smaller still when no
    // layout used every remaining node: the search then says so in stats.note)
    const parentDevices = parent ? parent.device_count || (c.num_nodes + lost) * c.devices_per_node : 0;
    const parentNodes = Math.round(parentDevices / c.devices_per_node);
    const entries = [];
    if (parent) entries.push({ label: `before (${parentNodes} nodes)`, plan: parent, devices: parentDevices });
    if (best) entries.push({ label: parent ? `after losing ${lost} (${c.num_nodes} nodes used)` : `this cluster (${c.num_nodes} nodes)`,
                             plan: best, devices });
    for (const w of data.what_ifs || []) {
      if (w.best) entries.push({ label: `lose ${w.lose_nodes} (${c.num_nodes - w.lose_nodes} nodes)`, plan: w.best,
                                 devices: (c.num_nodes - w.lose_nodes) * c.devices_per_node, url: w.url });
    }
    const summary = root.querySelector(".what-if-summary");
    if (!entries.length) { summary.textContent = "Nothing to compare yet."; return; }
    drawWhatIf(root, entries);
    if (parent && best) {
      const same = sameStrategy(parent.strategy, best.strategy);
      const change = best.predicted.tokens_per_s / parent.predicted.tokens_per_s - 1;
      summary.textContent = `Losing ${lost} of ${parentNodes} nodes: ` +
        (same ? "the best strategy stays the same" : `the best strategy changes from ${strategyText(parent.strategy)} to ${strategyText(best.strategy)}`) +
        `; throughput ${pct(change, 1, { signed: true })}.` +
        (data.search.stats && data.search.stats.note ? ` Note: ${data.search.stats.note}.` : "");
    } else {
      summary.textContent = "Enter how many nodes to lose: the search re-runs on the smaller cluster and this view compares the best plans.";
    }
  }

  function renderDiffDefault() {
    const best = bestPlan();
    if (!views.diff || !best) return;
    if (data.parent_best) {
      const lost = data.search.what_if ? data.search.what_if.lose_nodes : 0;
      drawDiff(views.diff, data.parent_best, best, ["before (parent's best)", `after losing ${lost} node${lost === 1 ? "" : "s"}`],
               data.parent_best.id && best.id ? data.urls.diff.replace("{a}", data.parent_best.id).replace("{b}", best.id) : null);
      return;
    }
    const second = secondPlan();
    const other = second || best;
    drawDiff(views.diff, best, other, ["#1", second ? `#${second.rank}` : "#1"],
             second ? data.urls.diff.replace("{a}", best.id).replace("{b}", second.id) : null);
  }

  function renderResults() {
    document.querySelectorAll(".viz-wait").forEach((n) => n.remove());
    renderProgress(progress, data.search, state.live);
    renderPlanTable();
    renderSimilar();
    const best = bestPlan();
    renderOutcome(data, Boolean(best));
    if (!best) {
      if (terminal(data.search.state)) return;  // renderOutcome hid the views: one message says why
      for (const k of ["pareto", "memory", "steptime", "schedule", "placement", "diff", "whatif"]) {
        if (views[k] && !views[k].dataset.ready) views[k].append(h("p", { class: "muted viz-wait" }, "Waiting for the search…"));
      }
      return;
    }
    const shown = best && data.visuals ? showSelection(best, data.visuals, "#1 (best)")
      : best ? pick(best.strategy, "#1 (best)") : Promise.resolve();
    renderDiffDefault();
    renderWhatIf();
    return shown;
  }

  // ---------------------------------------------------------------- live progress
  // When the search ends the page asks the API for its data again (the same JSON the view rendered into
  // it, from planning.selectors.search_page_data) and redraws; the state badge follows that JSON.
  async function refresh() {
    const r = await getJSON(data.urls.page_data);
    if (!r.ok || !r.body) {
      progress.querySelector(".search-error").textContent =
        `The search ended, but its results did not load: ${failureLines(r, "page data").join("; ")}. Reload the page.`;
      return;
    }
    data = r.body;
    state.live = {};  // the search ended: from here on the page data is the only source
    await renderResults();
  }

  // The views' data (the candidates, plans and visuals: 1.8 MB for the seed search) after the first paint:
  // the page shows its header and progress at once instead of after the whole document (issue 35).
  renderProgress(progress, data.search, state.live);
  const first = await getJSON(data.urls.page_data);
  if (!first.ok || !first.body) {
    progress.querySelector(".search-error").textContent =
      `The search's results did not load: ${failureLines(first, "page data").join("; ")}. Reload the page.`;
    return;
  }
  data = first.body;

  if (!terminal(data.search.state)) {
    // The websocket brings progress and the end; while it is not open (connecting, reconnecting, signed
    // out) the page polls the search instead, and stops again as soon as the socket is open.
    let finished = false;
    let poll = null;
    let client = null;
    const stopPolling = () => { clearInterval(poll); poll = null; };
    const startPolling = () => { if (!poll && !finished) poll = setInterval(pollSearch, POLL_MS); };
    const finish = () => {
      if (finished) return;
      finished = true;
      stopPolling();
      if (client) client.close();
      refresh();
    };
    async function pollSearch() {
      const r = await getJSON(data.urls.search);
      if (!r.ok || finished) return;
      const s = r.body;
      if (terminal(s.state)) { state.live.state = s.state; finish(); return; }
      state.live.state = s.state;
      if (s.progress >= (state.live.fraction || 0)) state.live.fraction = s.progress;
      renderProgress(progress, data.search, state.live);
    }
    client = new LiveClient({
      onEvent: (e) => {
        if (finished) return;  // the page data has the last word once the search ended
        if (e.kind === "progress") {
          Object.assign(state.live, e.values || {});
          state.live.state = "running";  // progress comes only from a running search
          window.__viz.progress.push(e.values && e.values.fraction);
          renderProgress(progress, data.search, state.live);
        } else if (e.kind === "event" && e.values && e.values.state) {
          state.live.state = e.values.state;
          renderProgress(progress, data.search, state.live);
          if (terminal(e.values.state)) finish();
        }
      },
      onStatus: (s) => {
        progress.dataset.live = s;
        if (s === "live") stopPolling(); else startPolling();
      },
    });
    client.subscribe(data.search.stream);
    const cancel = document.getElementById("cancel-search");
    if (cancel) cancel.addEventListener("click", async () => {
      const r = await postJSON(data.urls.cancel, {});
      cancel.disabled = true;
      cancel.textContent = r.ok ? "cancelling…" : failureLines(r, "cancel failed").join("; ");
    });
  }
  return renderResults();
}

// -------------------------------------------------------------------------------------- the plan page

export function initPlanPage() {
  const data = readData();
  const plan = data.plan;
  const cap = data.cluster && data.cluster.device ? data.cluster.device.memory_GiB : null;
  const v = data.visuals;
  const label = plan.name || "this plan";
  const ru = data.runner_up;
  const memEntries = [{ label, memory: v ? v.memory : memoryOf(plan) }];
  const stepEntries = [{ label, step: v ? v.step_time : stepOf(plan) }];
  if (ru) {
    memEntries.push({ label: "runner-up", memory: memoryOf(ru) });
    stepEntries.push({ label: "runner-up", step: stepOf(ru) });
  }
  drawMemory(document.getElementById("view-memory"), memEntries, cap);
  drawStepTime(document.getElementById("view-steptime"), stepEntries);
  if (v) {
    drawSchedule(document.getElementById("view-schedule"), v.schedule);
    drawPlacement(document.getElementById("view-placement"), v.placement);
  }
  const measured = document.getElementById("view-measured");
  if (measured) drawMeasured(measured, plan);
  renderJobs(document.getElementById("plan-jobs"), data);
  bindLaunch(document.getElementById("launch"), data);
  bindScaleDown(document.getElementById("scale-down-form"), data);
  window.__viz = { data };
}

// "Launch a scaled-down version": POST /api/plans/<id>/scale-down/ stores the scaled plan and starts its job
// (labelled "scaled-down from plan #N") with the options set (launch_options.js); the page then follows the job.
function bindScaleDown(form, data) {
  if (!form) return;
  const out = form.querySelector(".launch-errors");
  bindLaunchOptions(form);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    out.replaceChildren(h("li", { class: "muted" }, "storing the scaled-down plan and launching it…"));
    const r = await postJSON(data.urls.scale_down, { steps: Number(new FormData(form).get("steps") || 20),
                                                     ...launchOptions(form) });
    if (r.status === 201 && r.body && r.body.job) { location.assign(r.body.job.url); return; }
    button.disabled = false;
    showLaunchErrors(form, out, r, "scaled-down launch failed");
  });
}

function renderJobs(root, data) {
  if (!root) return;
  const jobs = data.jobs || [];
  const page = (data.urls && data.urls.job_page) || "/jobs/{id}/";
  root.replaceChildren(jobs.length
    ? h("ul", { class: "plan-jobs" }, jobs.map((j) => h("li", {},
        h("a", { href: page.replace("{id}", j.id) }, `job #${j.id}`), " ", h("span", { class: `state ${j.state}` }, j.state),
        j.measured && j.measured.tokens_per_s != null ? ` · measured ${num(j.measured.tokens_per_s)} tokens/s` : "")))
    : h("p", { class: "muted" }, "No job has run this plan yet."));
}

function bindLaunch(form, data) {
  if (!form) return;
  const out = form.querySelector(".launch-errors");
  bindLaunchOptions(form);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    out.replaceChildren(h("li", { class: "muted" }, "launching…"));
    const fd = new FormData(form);
    // plan_id: the job takes the stored plan's strategy, model and training config, and its measured
    // figures come back to this plan when it succeeds; the options block (launch_options.js) adds only the
    // options set; profile_every (filled in as 5) gives the compute/comm split
    const body = { name: fd.get("name") || data.plan.name || `plan ${data.plan.id}`, plan_id: data.plan.id,
                   steps: Number(fd.get("steps") || 20), ...(launchOptions(form) || { profile_every: 5 }) };
    const r = await postJSON(data.urls.launch, body);
    if (r.status === 201 && r.body && r.body.id != null) { location.assign(`/jobs/${r.body.id}/`); return; }
    button.disabled = false;
    showLaunchErrors(form, out, r, "launch failed");
  });
}

// -------------------------------------------------------------------------------------- the diff page

export function initDiffPage() {
  const data = readData();
  const labels = [data.a.name || `plan ${data.a.id}`, data.b.name || `plan ${data.b.id}`];
  if (labels[0] === labels[1]) { labels[0] += " (A)"; labels[1] += " (B)"; }
  const table = document.getElementById("diff-table");
  if (table) { table.replaceChildren(diffTable(data.a, data.b, labels)); table.dataset.ready = "1"; }
  drawDiffCharts(document.getElementById("view-diff"), data.a, data.b, labels);
  window.__viz = { data };
}
