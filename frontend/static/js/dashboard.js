// The dashboard: health, the live job and search tables, and the live-events panel as a timeline.
//
// Tables: the job rows follow the team's "jobs" feed and the streams of active jobs (job_rows.js), as on
// the jobs page; a search row follows its stream while it runs (progress events carry the fraction,
// event events the state). The panel follows one chosen stream on a socket of its own and renders each
// event as one readable line (event_text.js); the raw JSON opens under it on click. A running job's row
// carries its fault-risk badge (risk.js): its API record's `risk`, then its live risk events.
import { LiveClient } from "./live.js";
import { LiveJobRows, TERMINAL, renderRow, timeAgo } from "./job_rows.js";
import { LiveRiskBadges, setJobBadge } from "./risk.js";
import { describeEvent } from "./event_text.js";
import { failureLines, h, postJSON } from "./common.js";

const PANEL_MAX = 200;  // timeline entries kept (the oldest go)

// ------------------------------------------------------------------------------------- live panel

export function timelineEntry(e) {
  const { badge, badgeClass, text } = describeEvent(e);
  const when = new Date(e.time);
  const summary = h("summary", {},
    h("time", { datetime: e.time, title: e.time }, Number.isNaN(when.getTime()) ? "" : when.toLocaleTimeString([], { hour12: false })),
    h("span", { class: `badge ${badgeClass}` }, badge),
    h("span", { class: "stream" }, `${e.stream} #${e.seq}`),
    h("span", { class: "text" }, text));
  const raw = h("pre", { class: "raw" }, JSON.stringify(e, null, 2));
  return h("li", { class: `event ${e.kind}`, dataset: { seq: e.seq, kind: e.kind } }, h("details", {}, summary, raw));
}

function initPanel() {
  const list = document.getElementById("live-events");
  const status = document.getElementById("live-status");
  const select = document.getElementById("live-stream");
  const add = (li) => {
    list.prepend(li);
    while (list.children.length > PANEL_MAX) list.lastElementChild.remove();
  };
  const client = new LiveClient({
    onStatus: (s) => { status.textContent = s; status.dataset.state = s; },
    onEvent: (e) => { if (e.stream === current) add(timelineEntry(e)); },
    onError: (m) => add(h("li", { class: "error" }, m.message)),
  });
  let current = null;
  function follow() {
    if (current) client.unsubscribe(current);
    list.replaceChildren();
    current = select.value || null;
    if (current) client.subscribe(current);
  }
  select.addEventListener("change", follow);
  follow();
  document.getElementById("send-probe").addEventListener("click", async () => {
    const opt = select.selectedOptions[0];
    if (!opt || !opt.dataset.probe) return;
    const r = await postJSON(opt.dataset.probe, { message: "probe from the dashboard" });
    if (!r.ok) add(h("li", { class: "error" }, `probe failed: ${failureLines(r).join("; ")}`));
  });
  return { client, select };
}

// ------------------------------------------------------------------------------------------ tables

class SearchRows {
  constructor(client, searches) {
    this.client = client;
    this.rows = new Map(searches.map((s) => [s.id, s]));
  }

  start() {
    for (const s of this.rows.values()) if (!TERMINAL.has(s.state)) this.client.subscribe(s.stream, s.last_seq || 0);
  }

  onEvent(e) {
    const s = this.rows.get(Number(e.stream.split("/")[1]));
    if (!s) return;
    const v = e.values || {};
    if (e.kind === "progress" && v.fraction != null) s.progress = v.fraction;
    if (e.kind === "event" && v.state) {
      s.state = v.state;
      if (v.state === "succeeded") s.progress = 1;
      if (TERMINAL.has(v.state)) this.client.unsubscribe(s.stream);
    }
    const tr = document.querySelector(`#dashboard-searches tr[data-search="${s.id}"]`);
    if (!tr) return;
    tr.dataset.state = s.state;
    tr.querySelector("td[data-col=state]").replaceChildren(h("span", { class: `state ${s.state}`, dataset: { state: s.state } }, s.state));
    tr.querySelector("td[data-col=progress]").textContent = `${Math.round(100 * (s.progress || 0))}%`;
  }
}

function initTables(lists, panel) {
  const tbody = document.querySelector("#dashboard-jobs tbody");
  const trs = new Map([...tbody.querySelectorAll("tr[data-job]")].map((tr) => [Number(tr.dataset.job), tr]));
  const newTr = (row) => h("tr", { dataset: { job: row.id } },
    ["id", "name", "team", "state", "risk", "progress", "tokens", "measured", "age"].map((col) =>
      h("td", { dataset: { col }, class: col === "tokens" || col === "measured" ? "num" : null })));
  const onRows = (ids, added) => {
    for (const id of ids) {
      const row = jobs.rows.get(id);
      let tr = trs.get(id);
      if (!tr) {
        tr = newTr(row);
        trs.set(id, tr);
        tbody.prepend(tr);
        tr.classList.add("fresh");
        if (added.includes(id) && !panel.select.querySelector(`option[value="${row.stream}"]`)) {
          panel.select.prepend(h("option", { value: row.stream, dataset: { probe: `/api/jobs/${id}/probe/` } }, `${row.stream} · ${row.name}`));
        }
      }
      renderRow(tr, row);
      risk.track(row);
      renderRisk(tr, row);
    }
    // the newest `recent` jobs, as the page was rendered
    const ordered = [...trs.keys()].sort((a, b) => b - a);
    for (const id of ordered.slice(lists.recent)) {  // an older job pushed out by a new one
      const stream = jobs.rows.get(id)?.stream;
      if (stream && client.subscribed(stream)) client.unsubscribe(stream);
      trs.get(id).remove();
      trs.delete(id);
      jobs.rows.delete(id);
    }
    for (const id of ordered.slice(0, lists.recent)) tbody.insertBefore(trs.get(id), tbody.querySelector("tr.empty-row"));
    tbody.querySelector("tr.empty-row").hidden = trs.size > 0;
  };
  // the risk cell: a running job's badge, else a neutral mark ("—": no score yet, or not running)
  const renderRisk = (tr, row) => {
    let badge = tr.querySelector("td[data-col=risk] .risk-badge");
    if (!badge) {
      badge = h("span", { class: "risk-badge" });
      tr.querySelector("td[data-col=risk]").replaceChildren(badge);
    }
    setJobBadge(badge, row.state, risk.badgeOf(row));
  };
  const risk = new LiveRiskBadges({
    onChange: (id) => { const tr = trs.get(id), row = jobs.rows.get(id); if (tr && row) renderRisk(tr, row); },
  });
  const status = (s) => { document.body.dataset.tablesLive = s; };
  const client = new LiveClient({
    onStatus: status,
    onEvent: (e) => {
      if (!e.stream.startsWith("job/")) { searches.onEvent(e); return; }
      jobs.onEvent(e);
      risk.onEvent(e);
    },
    onNotice: (m) => jobs.onNotice(m),
    onWatching: (m) => { document.body.dataset.jobsFeed = "watching"; jobs.onWatching(m); },
  });
  const jobs = new LiveJobRows({ client, rows: lists.jobs, limit: lists.recent, onRows });
  const searches = new SearchRows(client, lists.searches);
  onRows([...jobs.rows.keys()], []);
  jobs.start();
  searches.start();
  setInterval(() => { for (const t of tbody.querySelectorAll("td[data-col=age] time")) t.textContent = timeAgo(t.dateTime); }, 30000);
  return { client, jobs, searches, risk };
}

// ------------------------------------------------------------------------------------------ health

async function health() {
  const ul = document.getElementById("health");
  try {
    const r = await fetch("/healthz");
    const body = await r.json();
    ul.replaceChildren(...Object.entries(body.checks).map(([name, c]) =>
      h("li", { class: c.ok ? "ok" : "bad" }, `${name}: ${c.ok ? "ok" : "down"} — ${c.detail} (${c.ms} ms)`)));
  } catch (err) {
    ul.replaceChildren(h("li", { class: "bad" }, `health check failed: ${err}`));
  }
}

export function initDashboard(lists) {
  const panel = initPanel();
  const tables = initTables(lists, panel);
  health();
  setInterval(health, 15000);
  return { panel, tables };
}
