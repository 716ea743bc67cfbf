// Live job rows, shared by the jobs page and the dashboard.
//
// A row is what GET /api/jobs/rows/ answers (controlplane/jobs/selectors.py JobRow). The page follows:
// - the stream of every active row (queued, launching, running; at most MAX_FOLLOWED, newest first) from
//   the row's last stored seq: train events update progress, tokens/s and step time in place, with the
//   job page's arithmetic (the mean over the latest STEADY_WINDOW steady steps); state events the state;
// - the team feed "jobs": a notice names a job that was created, changed state or was annotated, and
//   the page re-reads just those rows (batched; a new job is added at the top).
// A finished job's stream is left once its final row is read; when the feed is (re)established the page
// re-reads all its rows once (what happened while it was off).
import { JOB_STATES } from "./event_text.js";
import { MISSING, formatNumber, formatSeconds, getJSON, h } from "./common.js";

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const STEADY_WINDOW = 10;   // the job page's window (job_series.js) and the selector's (STEADY_WINDOW)
const MAX_FOLLOWED = 40;           // the websocket allows 50 streams per connection
const REFRESH_DELAY_MS = 250;      // notices arriving together are read in one request
const ROWS_API = "/api/jobs/rows/";

// "12 s", "5 min", "3 h", "2 d": how long ago an ISO time was
export function timeAgo(iso, now = Date.now()) {
  const s = Math.max(0, (now - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h`;
  return `${Math.floor(s / 86400)} d`;
}

// ----------------------------------------------------------------------------------------- cells

const link = (row, text) => h("a", { href: row.url }, text);

// column -> {label, num?, sortValue(row), render(row) -> list of nodes}
export const JOB_COLUMNS = {
  id: { label: "#", sortValue: (r) => r.id, render: (r) => [link(r, String(r.id))] },
  name: {
    label: "Name", sortValue: (r) => r.name.toLowerCase(),
    render: (r) => [link(r, r.name), r.notes ? h("div", { class: "note-snippet muted", title: r.notes },
      r.notes.length > 90 ? `${r.notes.slice(0, 90)}…` : r.notes) : null],
  },
  team: { label: "Team", sortValue: (r) => r.team.toLowerCase(), render: (r) => [r.team] },
  state: {
    label: "State", sortValue: (r) => [...JOB_STATES].indexOf(r.state),
    render: (r) => [h("span", { class: `state ${r.state}`, dataset: { state: r.state } }, r.state),
      r.attempts > 1 ? h("span", { class: "muted small-inline" }, ` attempt ${r.attempts}`) : null],
  },
  progress: {
    label: "Progress", sortValue: (r) => r.progress,
    render: (r) => {
      if (r.progress == null) return [h("span", { class: "muted" }, MISSING)];
      const pct = Math.round(100 * r.progress);
      const bar = h("span", { class: "mini-bar", title: `${pct}%` }, h("span", { style: { width: `${pct}%` } }));
      const steps = r.steps ? `${formatNumber(r.state === "succeeded" ? r.steps : r.step)}/${formatNumber(r.steps)}` : `${pct}%`;
      return [bar, " ", h("span", { class: "progress-text" }, steps)];
    },
  },
  model: { label: "Model", sortValue: (r) => r.model.toLowerCase(), render: (r) => [r.model] },
  strategy: { label: "Strategy", sortValue: (r) => r.strategy, render: (r) => [h("code", {}, r.strategy)] },
  ranks: { label: "Ranks", sortValue: (r) => r.world_size, render: (r) => [`${r.nnodes}×${r.nproc_per_node}`] },
  tokens: {
    label: "Tokens/s", num: true, sortValue: (r) => r.tokens_per_s,
    render: (r) => [r.tokens_per_s != null ? formatNumber(r.tokens_per_s) : h("span", { class: "muted" }, MISSING)],
  },
  predicted: {
    label: "Step time predicted", num: true, sortValue: (r) => r.predicted_step_time_s,
    render: (r) => [r.predicted_step_time_s != null ? formatSeconds(r.predicted_step_time_s) : h("span", { class: "muted" }, "no plan")],
  },
  measured: {
    label: "measured", num: true, sortValue: (r) => r.measured_step_time_s,
    render: (r) => (r.measured_step_time_s == null ? [h("span", { class: "muted" }, MISSING)] : [
      formatSeconds(r.measured_step_time_s),
      r.measured_is_final ? null : r.measured_is_live
        ? h("span", { class: "muted", title: `mean of the latest ${STEADY_WINDOW} steady steps` }, " (live)")
        : h("span", { class: "muted", title: `mean of its last ${STEADY_WINDOW} steady steps before it stopped` }, " (last steps)"),
    ]),
  },
  age: {
    label: "Age", sortValue: (r) => Date.parse(r.created_at),
    render: (r) => [h("time", { datetime: r.created_at, title: r.created_at }, timeAgo(r.created_at))],
  },
  tags: {
    label: "Tags", sortValue: (r) => (r.tags || []).join(" ").toLowerCase(),
    render: (r) => (r.tags || []).map((t) => h("span", { class: "tag", dataset: { tag: t } }, t)),
  },
};

// Fill the cells of a row (<td data-col=...>) from its data; cells of other columns are left alone.
export function renderRow(tr, row) {
  tr.dataset.job = row.id;
  tr.dataset.state = row.state;
  for (const td of tr.querySelectorAll("td[data-col]")) {
    const col = JOB_COLUMNS[td.dataset.col];
    if (col) td.replaceChildren(...col.render(row).filter((n) => n != null));
  }
}

// ------------------------------------------------------------------------------------- live rows

export class LiveJobRows {
  // rows: the rows the page was rendered with; limit: how many the page lists; onRows(changed, added):
  // after rows changed (ids), and which of them are new to the page
  constructor({ client, rows, limit = 200, onRows = () => {} }) {
    this.client = client;
    this.limit = limit;
    this.onRows = onRows;
    this.rows = new Map();
    this.series = new Map();   // id -> {lastStep, attempt, recent: [[step_time_s, tokens_per_s]]}
    this.pending = new Set();  // ids to re-read
    this.timer = null;
    for (const row of rows) this.adopt(row);
  }

  start() {
    this.client.watch("jobs");
    this.follow();
  }

  adopt(row) {
    this.rows.set(row.id, row);
    this.series.set(row.id, { lastStep: row.last_step, attempt: null, recent: (row.steady || []).map((r) => [...r]) });
  }

  byStream(stream) {
    const id = Number(stream.split("/")[1]);
    return this.rows.get(id) || null;
  }

  // subscribe to the active rows' streams (newest first, bounded); leave finished ones
  follow() {
    const active = [...this.rows.values()].filter((r) => !TERMINAL.has(r.state)).sort((a, b) => b.id - a.id);
    const wanted = new Set(active.slice(0, MAX_FOLLOWED).map((r) => r.stream));
    for (const row of this.rows.values()) {
      if (wanted.has(row.stream) && !this.client.subscribed(row.stream)) this.client.subscribe(row.stream, row.last_seq || 0);
      else if (!wanted.has(row.stream) && this.client.subscribed(row.stream)) this.client.unsubscribe(row.stream);
    }
  }

  // the feed is on (page load, or the socket came back): re-read every row once, so a job created or
  // finished before the feed was on (or while the socket was down) is not missed
  onWatching(m) {
    if (m.feed === "jobs") this.refresh(null);
  }

  onNotice(m) {
    if (m.feed === "jobs" && Number.isInteger(m.id)) this.refresh([m.id]);
  }

  onEvent(e) {
    const row = this.byStream(e.stream);
    if (!row) return;
    row.last_seq = Math.max(row.last_seq || 0, e.seq);
    const v = e.values || {};
    if (e.kind === "train") {
      this.pushStep(row, e.step, v);
      if (row.state === "queued" || row.state === "launching") row.state = "running";
      this.onRows([row.id], []);
    } else if (e.kind === "event" && JOB_STATES.has(v.state)) {
      row.state = v.state;
      if (v.state === "queued" && v.attempt) row.attempts = v.attempt;
      this.onRows([row.id], []);
      this.refresh([row.id]);  // the final figures (run summary), the attempt count
    }
  }

  // the job page's steady window (job_series.js JobSeries): a step that does not increase, or a new attempt,
  // starts a new segment; its first step and profiled steps are left out
  pushStep(row, step, v) {
    const s = this.series.get(row.id);
    const newAttempt = v.attempt != null && s.attempt != null && v.attempt !== s.attempt;
    const first = s.lastStep == null || step <= s.lastStep || newAttempt;
    if (s.lastStep != null && (step <= s.lastStep || newAttempt)) s.recent = [];
    s.lastStep = step;
    if (v.attempt != null) s.attempt = v.attempt;
    if (!first && !v.profiled && v.step_time_s) {
      s.recent.push([v.step_time_s, v.tokens_per_s || 0]);
      if (s.recent.length > STEADY_WINDOW) s.recent.shift();
    }
    row.step = step;
    if (row.steps) row.progress = Math.min(1, step / row.steps);
    if (!row.measured_is_final && s.recent.length) {
      row.measured_step_time_s = s.recent.reduce((a, r) => a + r[0], 0) / s.recent.length;
      row.tokens_per_s = s.recent.reduce((a, r) => a + r[1], 0) / s.recent.length;
    }
  }

  // re-read some rows (ids) or all of them (null), batched over REFRESH_DELAY_MS
  refresh(ids) {
    if (ids === null) this.pending.add("all");
    else for (const id of ids) this.pending.add(id);
    if (this.timer === null) this.timer = setTimeout(() => this.flush(), REFRESH_DELAY_MS);
  }

  async flush() {
    this.timer = null;
    const all = this.pending.has("all");
    const ids = [...this.pending].filter((x) => x !== "all");
    this.pending.clear();
    const url = all ? `${ROWS_API}?limit=${this.limit}` : `${ROWS_API}?ids=${ids.join(",")}`;
    const r = await getJSON(url);
    if (!r.ok) return;  // the next notice or reconnect tries again
    const changed = [], added = [];
    for (const row of r.body) {
      const known = this.rows.get(row.id);
      if (known) {
        const s = this.series.get(row.id);
        // a row read from the database may lag the stream by a relay batch: keep the newer live figures
        if (!row.measured_is_final && s.lastStep != null && (row.last_step == null || row.last_step < s.lastStep)) {
          Object.assign(row, { step: known.step, progress: known.progress, tokens_per_s: known.tokens_per_s,
                               measured_step_time_s: known.measured_step_time_s, last_step: s.lastStep });
        } else {
          this.series.set(row.id, { lastStep: row.last_step, attempt: s.attempt, recent: (row.steady || []).map((x) => [...x]) });
        }
        this.rows.set(row.id, row);
        changed.push(row.id);
      } else {
        this.adopt(row);
        added.push(row.id);
      }
    }
    // (a re-read of all rows leaves rows that dropped out of the newest `limit` listed: nothing is taken
    // away from under the user)
    this.follow();
    this.onRows(changed.concat(added), added);
  }
}
