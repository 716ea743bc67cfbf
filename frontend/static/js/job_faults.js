// Elastic recovery on the job page: the faults table (and its markers on the loss chart), the snapshots
// table whose buttons restore the job from one (job_actions.js), and the goodput panel that splits the wall
// time. The page starts from the rows the server rendered; live `fault` / `recovery` / `snapshot` /
// `goodput` events update them (keyed: a repeat replaces).
import { formatBytes, formatNumber, formatPercent, formatSeconds } from "./common.js";

const BADPUT_LABELS = {
  startup_s: "start-up (processes, rendezvous, first step)",
  restore_s: "restore (reading a snapshot)",
  snapshot_stall_s: "snapshot stall (staging)",
  lost_progress_s: "lost progress (steps trained again)",
  fault_wait_s: "fault detection and restart",
  other_s: "other",
};

// The hover text of a fault marker: what happened, and how it was recovered.
export function describeFault(f) {
  const what = [f.kind, f.node_name && `node ${f.node_name}`, f.rank != null && `rank ${f.rank}`,
    f.step != null && `after step ${f.step}`,
    `attempt ${f.attempt}`].filter(Boolean).join(" · ");
  const how = f.recovered_at
    ? [f.rto_s != null && `RTO ${formatSeconds(f.rto_s)}`, f.steps_lost != null && `${f.steps_lost} step(s) lost`,
      f.resumed_from_step != null && `resumed from step ${f.resumed_from_step}` + (f.snapshot ? ` (${f.snapshot})` : "")]
      .filter(Boolean).join(" · ")
    : "not recovered (yet)";
  return `${what}<br>${how}`;
}

export class ElasticPanel {
  // `job`: the page's data (faults, snapshots, goodput); `charts`: the JobCharts the fault markers go on;
  // `ended()`: whether the job has ended (a snapshot can be restored only then)
  constructor(job, { charts, ended }) {
    this.charts = charts;
    this.ended = ended;
    this.faults = new Map((job.faults || []).map((f) => [f.id, f]));
    this.snapshots = new Map((job.snapshots || []).map((x) => [x.name, x]));
    this.goodput = job.goodput || null;
  }

  // the rows the job API answered (after the job ended): they replace the page's
  reload(job) {
    this.faults = new Map((job.faults || []).map((f) => [f.id, f]));
    this.snapshots = new Map((job.snapshots || []).map((x) => [x.name, x]));
    this.goodput = job.goodput || this.goodput;
    this.render();
    this.refreshIndex();
  }

  // the Elastic Training Index panel, rendered again by the server (the page's own template and selector,
  // /jobs/<id>/eti/): its goodput factor is the goodput this panel shows, never "no timeline" beside it
  async refreshIndex() {
    const panel = document.getElementById("eti-panel");
    if (!panel || !panel.dataset.refresh) return;
    const r = await fetch(panel.dataset.refresh, { headers: { Accept: "text/html" }, credentials: "same-origin" });
    if (!r.ok) return;
    const holder = document.createElement("div");
    holder.innerHTML = await r.text();  // our template, rendered for this user: no script in it
    const fresh = holder.querySelector("#eti-panel");
    if (fresh) panel.replaceWith(fresh);
  }

  render() {
    this.renderFaults();
    this.renderSnapshots();
    this.renderGoodput();
  }

  // the fault markers on the loss chart and the faults table
  renderFaults() {
    const faults = [...this.faults.values()].sort((a, b) => (a.detected_at || "").localeCompare(b.detected_at || "") || a.id - b.id);
    this.charts.showFaults(faults);
    const body = document.getElementById("fault-table").tBodies[0];
    body.replaceChildren(...faults.map((f) => {
      const tr = document.createElement("tr");
      tr.dataset.fault = f.id;
      tr.dataset.kind = f.kind;
      tr.dataset.recovered = f.recovered_at ? "yes" : "no";
      const cells = [
        [f.attempt + (f.restart ? ` · restart ${f.restart}` : ""), ""],
        [f.kind + (f.node_name ? ` (${f.node_name})` : ""), ""],
        [f.rank ?? "—", "num"],
        [f.step ?? "—", "num"],
        [f.recovered_at ? (f.resumed_from_step ?? "—") + (f.snapshot ? ` (${f.snapshot})` : "") : "recovering…", ""],
        [f.steps_lost ?? "—", "num"],
        [f.rto_s != null ? formatSeconds(f.rto_s) : "—", "num"],
      ];
      for (const [text, cls] of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      }
      tr.title = f.message || "";
      return tr;
    }));
    document.getElementById("faults-empty").hidden = faults.length > 0;
  }

  // the snapshots table, newest first, each with its "Restore from this snapshot" button
  renderSnapshots() {
    const rows = [...this.snapshots.values()].sort((a, b) => b.step - a.step || b.name.localeCompare(a.name));
    const body = document.getElementById("snapshot-table").tBodies[0];
    const ended = this.ended();
    body.replaceChildren(...rows.map((x) => {
      const tr = document.createElement("tr");
      tr.dataset.snapshot = x.name;
      const td = (text, cls = "") => {
        const el = document.createElement("td");
        el.textContent = text;
        if (cls) el.className = cls;
        return el;
      };
      const ratio = x.raw_bytes && x.bytes_written ? ` (${formatNumber(x.raw_bytes / x.bytes_written, 2)}× smaller than raw)` : "";
      const verified = td(x.verified ? "yes" : "no", x.verified ? "ok" : "bad");
      if (x.problem) verified.title = x.problem;
      const disk = x.on_disk == null ? "—" : x.on_disk;
      const when = x.created_at ? new Date(x.created_at).toLocaleTimeString([], { hour12: false }) : "—";
      const action = document.createElement("td");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "restore-button";
      button.dataset.snapshot = x.name;
      button.textContent = "Restore from this snapshot";
      const restorable = x.restorable !== false && x.verified;
      button.disabled = !ended || !restorable;
      button.title = !restorable ? "this snapshot cannot be restored (not verified, or no longer on disk)"
        : !ended ? "cancel the job (or let it end) first" : `a new attempt continues from step ${x.step}`;
      action.append(button);
      tr.append(td(x.name), td(x.step, "num"), td(x.kind), td(formatBytes(x.bytes_written) + ratio, "num"), verified,
        td(disk), td(when), action);
      return tr;
    }));
    document.getElementById("snapshots-empty").hidden = rows.length > 0;
  }

  // goodput %: productive training time over wall time, and each part of the badput in seconds
  renderGoodput() {
    const g = this.goodput;
    const value = document.getElementById("goodput-value");
    value.textContent = g ? formatPercent(g.goodput, 1) : "—";
    if (g && g.goodput != null) value.dataset.value = g.goodput; else delete value.dataset.value;
    document.getElementById("goodput-detail").textContent = g
      ? `${formatSeconds(g.productive_s)} productive of ${formatSeconds(g.wall_s)} wall time` +
        (g.attempt ? ` · attempt ${g.attempt}` : "") + (g.restarts ? ` · ${g.restarts} restart(s)` : "")
      : "";
    const body = document.getElementById("badput-table").tBodies[0];
    const badput = (g && g.badput) || {};
    body.replaceChildren(...Object.keys(badput).map((key) => {
      const tr = document.createElement("tr");
      tr.dataset.badput = key;
      const name = document.createElement("th");
      name.textContent = BADPUT_LABELS[key] || key.replace(/_s$/, "").replaceAll("_", " ");
      const seconds = document.createElement("td");
      seconds.className = "num";
      seconds.textContent = formatSeconds(badput[key]);
      seconds.dataset.value = badput[key];
      tr.append(name, seconds);
      return tr;
    }));
    document.getElementById("goodput-empty").hidden = !!g;
  }

  // a fault, a recovery, a snapshot or the goodput reported while the page is open
  note(v) {
    if (v.restarts_left != null) {  // the server's count after this fault (controlplane.jobs.selectors.restarts_left)
      const left = document.getElementById("job-restarts-left");
      if (left) { left.textContent = v.restarts_left; left.dataset.value = v.restarts_left; }
    }
    if (v.fault || v.recovery) {
      const f = v.recovery || v.fault;
      // a fault event after its recovery (the relay may store them out of order) does not undo it
      const known = this.faults.get(f.id);
      if (!(v.fault && known && known.recovered_at)) this.faults.set(f.id, f);
      this.renderFaults();
    }
    if (v.snapshot) {
      const x = v.snapshot;
      const where = x.removed ? "removed" : "present";
      this.snapshots.set(x.name, { ...(this.snapshots.get(x.name) || {}), ...x, on_disk: where, restorable: x.verified && !x.removed });
      this.renderSnapshots();
    }
    if (v.goodput) {
      this.goodput = v.goodput;
      this.renderGoodput();
      this.refreshIndex();
    }
  }
}
