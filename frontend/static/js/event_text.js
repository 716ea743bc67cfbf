// Live events as a person reads them: a badge (what kind of event) and one line of text, for timelines
// (the dashboard's live panel). "step 12 · loss 3.421 · 1,234 tokens/s · 41.2 ms/step" for a train event,
// "running: attempt 1 · 2 ranks" for a state change, "probe from host-3 via celery: ..." for a probe,
// "node-a · high (0.91) · snapshot now done: ..." for a risk event.
import { formatGiB, formatNumber, formatPercent, formatSeconds } from "./common.js";

export const JOB_STATES = new Set(["scheduled", "queued", "launching", "running", "recovering", "succeeded", "failed", "cancelled"]);

const join = (parts) => parts.filter((p) => p != null && p !== "" && p !== false).join(" · ");

// the scalar values of an object as "key value" pairs (nested objects and lists only named)
function scalars(v, skip = []) {
  return Object.entries(v || {})
    .filter(([k]) => !skip.includes(k))
    .map(([k, x]) => (x !== null && typeof x === "object" ? `${k} {…}` : `${k.replaceAll("_", " ")} ${x}`));
}

function describeTrain(step, v) {
  const ranks = Array.isArray(v.ranks) ? v.ranks : null;
  return join([
    step != null && `step ${formatNumber(step)}`,
    v.loss != null && `loss ${formatNumber(v.loss, 3)}`,
    v.tokens_per_s != null && `${formatNumber(v.tokens_per_s)} tokens/s`,
    v.step_time_s != null && `${formatSeconds(v.step_time_s)}/step`,
    v.profiled && "profiled (slowed by the profiler)",
    v.comm_density != null && `gradient density ${formatPercent(v.comm_density, v.comm_density < 0.01 ? 2 : 1)}`,
    ranks && `max RSS ${formatGiB(Math.max(...ranks.map((r) => r.rss_GiB || 0)), 2)} over ${ranks.length} ranks`,
  ]);
}

function describeState(step, v) {
  switch (v.state) {
    case "queued": return v.attempt ? `attempt ${v.attempt}` : "";
    case "launching": return join([v.attempt && `attempt ${v.attempt}`, Array.isArray(v.nodes) && `on ${v.nodes.join(", ")}`]);
    case "running": return join([v.attempt && `attempt ${v.attempt}`, Number.isFinite(v.nodes) && `${v.nodes} node(s)`,
      v.ranks && `${v.ranks} ranks`, v.message]);
    case "started": return join([v.world_size && `${v.world_size} ranks`, v.strategy, v.device && `${v.device}/${v.backend}`,
      v.model, v.params && `${formatNumber(v.params)} params`]);
    case "finished": return join([step != null && `step ${formatNumber(step)}`, v.step_time_s != null && `${formatSeconds(v.step_time_s)}/step`,
      v.tokens_per_s != null && `${formatNumber(v.tokens_per_s)} tokens/s`,
      v.loss_first != null && `loss ${formatNumber(v.loss_first, 3)} → ${formatNumber(v.loss_last, 3)}`]);
    default: return join([v.message, Array.isArray(v.exit_codes) && `exit codes ${v.exit_codes.join(", ")}`,
      v.measured && v.measured.tokens_per_s != null && `${formatNumber(v.measured.tokens_per_s)} tokens/s`]);
  }
}

function describeProgress(v) {
  const best = v.best || null;
  const bestStep = best && ((best.predicted || {}).step_time_s ?? best.step_time_s);
  return join([
    v.fraction != null && formatPercent(v.fraction, 0),
    v.evaluated != null && `${formatNumber(v.evaluated)} layouts evaluated`,
    v.feasible != null && `${formatNumber(v.feasible)} fit`,
    bestStep != null && `best ${formatSeconds(bestStep)}/step` + (v.best_from ? ` (${v.best_from})` : ""),
    v.method && `method ${v.method}`,
  ]) || join(scalars(v));
}

// a node's telemetry sample: "node-a · CPU 41% · memory 38% used · 2 source(s) absent"
function describeTelemetry(v) {
  const m = v.metrics || {};
  const absent = v.absent ? Object.keys(v.absent).length : 0;
  return join([
    v.node,
    m["cpu.util_pct"] != null && `CPU ${formatNumber(m["cpu.util_pct"], 0)}%`,
    m["mem.used_pct"] != null && `memory ${formatNumber(m["mem.used_pct"], 0)}% used`,
    absent && `${absent} source(s) absent`,
  ]) || join(scalars(v, ["metrics", "absent", "cost"]));
}

// a node's risk: its level and score, the flag or the prevention action it carries
function describeRisk(v) {
  const a = v.action;
  const f = v.flag;
  return join([
    v.node,
    v.level && `${v.level}${v.risk != null ? ` (${formatNumber(v.risk, 2)})` : ""}`,
    f && `rank ${f.rank} ${f.event === "cleared" ? "no longer flagged" : "flagged"}${f.reason ? `: ${f.reason}` : ""}`,
    a && `${a.action.replaceAll("_", " ")} ${a.status}${a.reason ? `: ${a.reason}` : ""}`,
  ]);
}

// the job's running energy and carbon: "0.0123 kWh · 4.1 gCO2e · 35 W · estimate" (the meter's method)
function describeEnergy(v) {
  return join([
    v.kwh != null && `${formatNumber(v.kwh, 4)} kWh`,
    v.kgco2e != null && `${formatNumber(v.kgco2e * 1000, 1)} gCO2e`,
    v.watts != null && `${formatNumber(v.watts, 0)} W`,
    v.method === "estimate" ? "estimate" : v.method,
  ]) || join(scalars(v));
}

// -> {badge, badgeClass, text}
export function describeEvent(e) {
  const v = e.values || {};
  if (e.kind === "train") return { badge: "train", badgeClass: "kind-train", text: describeTrain(e.step, v) };
  if (e.kind === "progress") return { badge: "progress", badgeClass: "kind-progress", text: describeProgress(v) };
  if (e.kind === "telemetry") return { badge: "telemetry", badgeClass: "kind-telemetry", text: describeTelemetry(v) };
  if (e.kind === "risk") return { badge: "risk", badgeClass: `kind-risk level-${v.level || "low"}`, text: describeRisk(v) };
  if (e.kind === "energy") return { badge: "energy", badgeClass: "kind-energy", text: describeEnergy(v) };
  if (e.kind === "event") {
    if (v.state) {
      const text = describeState(e.step, v);
      const words = JOB_STATES.has(v.state) ? `now ${v.state}` : v.state;
      return { badge: v.state, badgeClass: `state ${v.state}`, text: text ? `${words}: ${text}` : words };
    }
    if (v.source && v.worker) {  // the dashboard's live probe, published by a Celery worker
      return { badge: "probe", badgeClass: "kind-probe",
               text: `probe from ${v.worker} via ${v.source}` + (v.message ? `: “${v.message}”` : "") };
    }
    if (v.comm_switch) {  // the adaptive comm hook changed a bucket's method or density
      const c = v.comm_switch;
      return { badge: "comm", badgeClass: "kind-comm",
               text: `bucket ${c.bucket} (${c.first_param}): ${c.from} → ${c.to}: ${c.reason}` };
    }
    if (v.comm_compare) {
      const c = v.comm_compare;
      const what = c.state ? `now ${c.state}` : c.method ? `method ${c.method} measured` : "update";
      return { badge: "comm", badgeClass: "kind-comm",
               text: join([`communication comparison #${c.id} ${what}`, c.message]) };
    }
    return { badge: "event", badgeClass: "kind-event", text: v.message || join(scalars(v)) };
  }
  return { badge: e.kind || "event", badgeClass: `kind-${e.kind || "event"}`, text: join(scalars(v)) };
}
