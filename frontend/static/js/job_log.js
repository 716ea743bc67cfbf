// The job page's text: the live log (the node supervisors' batches of lines, noise already left out; the
// stored tail for a job that sent none) and the events timeline (one line per lifecycle event).
import { formatBytes, formatNumber, formatPercent, formatSeconds } from "./common.js";
import { describeFault } from "./job_faults.js";

const LOG_MAX_LINES = 2000;  // lines the log panel keeps (the node's log file on the worker has them all)

export class JobLog {
  constructor(page) {
    this.nnodes = page.nnodes;
    this.lines = [];
    this.attempt = null;
    this.started = false;  // a live batch came (else the panel shows the tail the supervisor stored)
  }

  get panel() { return document.getElementById("job-log"); }

  // new lines of the live log (the node supervisor's batches, noise already left out)
  append(v, attempt) {
    const log = this.panel;
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
    const lines = this.lines;
    if (attempt !== this.attempt && (this.attempt !== null || attempt > 1)) lines.push(`── attempt ${attempt} ──`);
    this.attempt = attempt;
    const prefix = this.nnodes > 1 ? `[node ${v.node ?? "?"}] ` : "";
    for (const line of v.log) lines.push(prefix + line);
    if (lines.length > LOG_MAX_LINES) lines.splice(0, lines.length - LOG_MAX_LINES);
    this.started = true;
    log.textContent = lines.join("\n");
    log.dataset.lines = lines.length;
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  // no live log came (an older job): the tail the supervisor stored
  showStoredTail(text) {
    if (this.started) return;
    this.panel.textContent = text || "(no log)";
    this.scrollToEnd();
  }

  scrollToEnd() {
    const log = this.panel;
    log.scrollTop = log.scrollHeight;
  }
}

// A lifecycle event (not a log batch) as the newest line of the events timeline.
export function addToTimeline(e) {
  const v = e.values || {};
  const li = document.createElement("li");
  li.dataset.seq = e.seq;
  li.dataset.state = v.state || "";
  const when = new Date(e.time);
  const time = document.createElement("time");
  time.dateTime = e.time;
  time.textContent = when.toLocaleTimeString([], { hour12: false });
  const state = document.createElement("span");
  state.className = `state ${v.state || (v.fault ? "failed" : "")}`;
  state.textContent = v.state || (v.fault ? "fault" : v.recovery ? "recovered" : v.snapshot ? "snapshot" : v.goodput ? "goodput" : "event");
  const detail = document.createElement("span");
  detail.className = "detail";
  detail.textContent = describe(v, e.step);
  li.append(time, " ", state, " ", detail);
  document.getElementById("job-events").append(li);
}

// One line of the events timeline for an event's values.
function describe(v, step) {
  const attempt = v.attempt ? `attempt ${v.attempt}` : "";
  if (v.recovery) return describeFault(v.recovery).replace("<br>", " — recovered: ");
  if (v.fault) return `${describeFault(v.fault).split("<br>")[0]}` + (v.fault.message ? `: ${v.fault.message}` : "");
  if (v.snapshot) {
    const x = v.snapshot;
    return `snapshot ${x.name} (${x.kind}, ${formatBytes(x.bytes_written)}${x.verified ? ", verified" : ", NOT verified"})`;
  }
  if (v.goodput && !v.state) return `goodput ${formatPercent(v.goodput.goodput, 1)} of ${formatSeconds(v.goodput.wall_s)}`;
  switch (v.state) {
    case "queued": return [attempt, v.message].filter(Boolean).join(" · ");
    case "running": return [attempt, v.nodes && `${v.nodes} node(s)`, v.ranks && `${v.ranks} ranks`].filter(Boolean).join(", ");
    case "launching": return [attempt, v.nodes && `on ${v.nodes.join(", ")}`].filter(Boolean).join(" ");
    case "started": return `${v.world_size} ranks · ${v.strategy} · ${v.device}/${v.backend} · ${v.model}` + (v.entrypoint ? " · your script (SDK)" : ` · ${formatNumber(v.params)} params`) + (v.start_step ? ` · resumed at step ${v.start_step}` : "");
    case "stopped": return `stopped when asked, after step ${step}`;
    case "finished": return `step ${step} · ${formatSeconds(v.step_time_s)}/step · ${formatNumber(v.tokens_per_s)} tokens/s · loss ${formatNumber(v.loss_first, 3)} → ${formatNumber(v.loss_last, 3)}`;
    case "succeeded": case "failed": case "cancelled": {
      const parts = [];
      if (v.message) parts.push(v.message);
      if (v.exit_codes && v.state !== "cancelled") parts.push(`exit codes ${v.exit_codes.join(", ")}`);
      return parts.join(" · ");
    }
    default: return v.message || Object.entries(v).filter(([k]) => k !== "state").map(([k, x]) => `${k}=${typeof x === "object" ? JSON.stringify(x) : x}`).join(" ");
  }
}
