// The jobs page (/jobs/): a live run table (job_rows.js) that sorts by any column and filters by state,
// team, tag and a text search (name, model, strategy, notes); filters and sort live in the URL
// (?state=running&tag=baseline&q=moe&sort=tokens&dir=desc) so a view can be shared. Plus the compare
// picks, the tags-and-notes editor and the launch form.
import { LiveClient } from "./live.js";
import { JOB_COLUMNS, LiveJobRows, TERMINAL, renderRow, timeAgo } from "./job_rows.js";
import { editAnnotations } from "./annotate.js";
import { csrfToken, failureLines, formatNumber, h, postJSON, showErrorLines } from "./common.js";

const ACTIVE = new Set(["queued", "launching", "running", "recovering"]);
const FILTERS = ["q", "state", "team", "tag"];

class RunTable {
  constructor({ table, rows, maxCompared }) {
    this.table = table;
    this.tbody = table.tBodies[0];
    this.filters = document.getElementById("job-filters");
    this.count = document.getElementById("job-count");
    this.trs = new Map();  // id -> <tr>
    this.rows = rows;      // LiveJobRows (set by the page)
    this.sort = { col: null, dir: 1 };
    this.maxCompared = maxCompared;
    this.chosen = [];      // compare picks, in the order they were ticked
    for (const tr of this.tbody.querySelectorAll("tr[data-job]")) this.trs.set(Number(tr.dataset.job), tr);
  }

  // ------------------------------------------------------------------------------------------ rows

  newTr(row) {
    const cells = [h("td", {}, h("input", { type: "checkbox", class: "pick", value: row.id, "aria-label": `compare job ${row.id}` }))];
    for (const th of this.table.tHead.rows[0].cells) {
      const col = th.dataset.sort;
      if (col) cells.push(h("td", { dataset: { col }, class: JOB_COLUMNS[col].num ? "num" : null }));
    }
    cells.push(h("td", { class: "row-actions" }, h("button", { type: "button", class: "link annotate", dataset: { job: row.id },
      title: `edit the tags and notes of job ${row.id}` }, "tags/notes")));
    return h("tr", { dataset: { job: row.id } }, cells);
  }

  // rows changed (ids) and which are new: render them, then filter and sort again
  update(ids, added = []) {
    for (const id of ids) {
      const row = this.rows.rows.get(id);
      if (!row) continue;
      let tr = this.trs.get(id);
      if (!tr) {
        tr = this.newTr(row);
        this.trs.set(id, tr);
        this.tbody.prepend(tr);  // a new job is the newest: on top until a sort says otherwise
      }
      renderRow(tr, row);
      if (added.includes(id)) tr.classList.add("fresh");
    }
    this.refreshTagOptions();
    this.apply();
  }

  // ------------------------------------------------------------------------------- filter and sort

  values() {
    const f = this.filters.elements;
    return { q: f.q.value.trim().toLowerCase(), state: f.state.value, team: f.team.value, tag: f.tag.value };
  }

  matches(row, v) {
    if (v.state === "active" ? !ACTIVE.has(row.state) : v.state && row.state !== v.state) return false;
    if (v.team && row.team_slug !== v.team) return false;
    if (v.tag && !(row.tags || []).includes(v.tag)) return false;
    if (v.q) {
      const text = [row.name, row.model, row.strategy, row.notes, `#${row.id}`].join("\n").toLowerCase();
      if (!text.includes(v.q)) return false;
    }
    return true;
  }

  compare(a, b) {
    const col = JOB_COLUMNS[this.sort.col];
    const x = col.sortValue(a), y = col.sortValue(b);
    const missing = (z) => z == null || (typeof z === "number" && Number.isNaN(z));
    if (missing(x) || missing(y)) return (missing(x) - missing(y)) || b.id - a.id;  // no figure: last, either way
    const order = x < y ? -1 : x > y ? 1 : 0;
    return order * this.sort.dir || b.id - a.id;
  }

  apply() {
    const v = this.values();
    let shown = 0;
    for (const [id, tr] of this.trs) {
      const row = this.rows.rows.get(id);
      const show = !row || this.matches(row, v);
      tr.hidden = !show;
      if (show) shown += 1;
    }
    if (this.sort.col) {
      const ordered = [...this.trs.keys()].map((id) => this.rows.rows.get(id)).filter(Boolean).sort((a, b) => this.compare(a, b));
      const current = [...this.tbody.querySelectorAll("tr[data-job]")].map((tr) => Number(tr.dataset.job));
      if (ordered.some((row, i) => row.id !== current[i])) {  // move rows only when the order changed
        const marker = this.tbody.querySelector("tr.empty-row");
        for (const row of ordered) this.tbody.insertBefore(this.trs.get(row.id), marker);
      }
    }
    const total = this.trs.size;
    this.tbody.querySelector("tr.empty-row").hidden = total > 0;
    this.tbody.querySelector("tr.no-match-row").hidden = !(total > 0 && shown === 0);
    this.count.textContent = shown === total ? `${total} job${total === 1 ? "" : "s"}` : `${shown} of ${total} jobs shown`;
    this.count.dataset.shown = shown;
    for (const th of this.table.tHead.rows[0].cells) {
      if (!th.dataset.sort) continue;
      const sorted = th.dataset.sort === this.sort.col;
      th.setAttribute("aria-sort", sorted ? (this.sort.dir > 0 ? "ascending" : "descending") : "none");
    }
    this.saveToUrl();
  }

  refreshTagOptions() {
    const select = this.filters.elements.tag;
    const tags = new Set();
    for (const row of this.rows.rows.values()) for (const t of row.tags || []) tags.add(t);
    if (select.value) tags.add(select.value);
    const wanted = ["", ...[...tags].sort((a, b) => a.localeCompare(b))];
    const have = [...select.options].map((o) => o.value);
    if (wanted.join("\u0000") === have.join("\u0000")) return;
    const value = select.value;
    select.replaceChildren(...wanted.map((t) => h("option", { value: t }, t || "any")));
    select.value = value;
  }

  sortBy(col) {
    this.sort = this.sort.col === col ? { col, dir: -this.sort.dir } : { col, dir: col === "age" || col === "id" ? -1 : 1 };
    this.apply();
  }

  saveToUrl() {
    const params = new URLSearchParams(location.search);
    const v = this.values();
    for (const k of FILTERS) { if (v[k]) params.set(k, this.filters.elements[k].value.trim()); else params.delete(k); }
    if (this.sort.col) { params.set("sort", this.sort.col); params.set("dir", this.sort.dir > 0 ? "asc" : "desc"); }
    else { params.delete("sort"); params.delete("dir"); }
    const query = params.toString();
    const url = `${location.pathname}${query ? `?${query}` : ""}${location.hash}`;
    if (url !== `${location.pathname}${location.search}${location.hash}`) history.replaceState(null, "", url);
  }

  loadFromUrl() {
    const params = new URLSearchParams(location.search);
    for (const k of FILTERS) {
      const value = params.get(k);
      if (value == null) continue;
      const el = this.filters.elements[k];
      if (el.tagName === "SELECT" && ![...el.options].some((o) => o.value === value)) el.append(h("option", { value }, value));
      el.value = value;
    }
    const col = params.get("sort");
    if (col && JOB_COLUMNS[col]) this.sort = { col, dir: params.get("dir") === "desc" ? -1 : 1 };
  }

  // ------------------------------------------------------------------------------------ interaction

  bind() {
    for (const th of this.table.tHead.rows[0].cells) {
      const col = th.dataset.sort;
      if (!col) continue;
      const label = th.textContent;
      th.replaceChildren(h("button", { type: "button", class: "sort", title: `sort by ${label}`, onclick: () => this.sortBy(col) }, label));
    }
    this.filters.addEventListener("input", () => this.apply());
    this.filters.addEventListener("change", () => this.apply());
    this.filters.addEventListener("submit", (ev) => ev.preventDefault());
    document.getElementById("clear-filters").addEventListener("click", () => {
      for (const k of FILTERS) this.filters.elements[k].value = "";
      this.apply();
    });
    this.tbody.addEventListener("click", (ev) => {
      const chip = ev.target.closest(".tag[data-tag]");
      if (chip) { this.filters.elements.tag.value = chip.dataset.tag; this.apply(); return; }
      const button = ev.target.closest("button.annotate");
      if (button) this.annotate(Number(button.dataset.job));
    });
    this.tbody.addEventListener("change", (ev) => { if (ev.target.matches("input.pick")) this.pick(ev.target); });
    setInterval(() => {  // ages move on
      for (const t of this.tbody.querySelectorAll("td[data-col=age] time")) t.textContent = timeAgo(t.dateTime);
    }, 30000);
  }

  async annotate(id) {
    const row = this.rows.rows.get(id);
    if (!row) return;
    const job = await editAnnotations(row);
    if (!job) return;
    Object.assign(row, { tags: job.tags, notes: job.notes });
    this.update([id]);
  }

  pick(box) {
    const ids = document.getElementById("compare-ids");
    const button = document.getElementById("compare-button");
    const hint = document.getElementById("compare-hint");
    this.hintText = this.hintText || hint.textContent;
    if (box.checked) {
      if (this.chosen.length >= this.maxCompared) {
        box.checked = false;
        hint.textContent = `At most ${this.maxCompared} jobs on one chart: untick one first.`;
        hint.classList.add("error");
        return;
      }
      this.chosen.push(box.value);
    } else {
      this.chosen.splice(this.chosen.indexOf(box.value), 1);
    }
    hint.textContent = this.hintText;
    hint.classList.remove("error");
    ids.value = this.chosen.join(",");
    button.disabled = this.chosen.length < 1;
  }
}

function bindLaunchForm() {
  const examples = JSON.parse(document.getElementById("launch-examples").textContent);
  const form = document.getElementById("launch-form");
  const errors = document.getElementById("launch-errors");
  for (const opt of form.elements.strategy.options) {
    const s = examples.strategies[opt.value];
    const world = (s.tp || 1) * (s.pp || 1) * (s.dp || 1) * (s.cp || 1);
    opt.textContent = `${opt.value} (${world} rank${world > 1 ? "s" : ""})`;
  }
  // a Hugging Face config.json: stored as a model of the knowledge base, the one this launch trains
  let hfModel = null;
  const hfConfig = document.getElementById("hf-config");
  const summary = document.getElementById("hf-model-summary");
  const importConfig = async () => {
    errors.replaceChildren();
    hfModel = null;
    summary.textContent = "";
    const file = hfConfig.files[0];
    if (!file) return;
    const data = new FormData();
    data.append("file", file);
    data.append("name", `${file.name.replace(/\.json$/, "")} ${new Date().toISOString().slice(0, 23)}`);
    if (form.elements.seq_length.value) data.append("seq_length", form.elements.seq_length.value);
    if (form.elements.team) data.append("team", form.elements.team.value);
    const r = await fetch("/api/models/from-hf-config/", { method: "POST", body: data, credentials: "same-origin",
                                                          headers: { Accept: "application/json", "X-CSRFToken": csrfToken() } });
    const body = await r.json().catch(() => null);
    if (r.status !== 201) { showErrorLines(errors, failureLines({ status: r.status, body }, "config.json refused")); return; }
    hfModel = Object.fromEntries(Object.entries(body).filter(([k]) => !["id", "team", "created_at", "updated_at"].includes(k)));
    const params = body.params_billion != null ? `${formatNumber(body.params_billion * 1e9)} parameters` : "";
    summary.textContent = `${body.architecture.family} · ${params} · stored as model #${body.id}`;
    summary.dataset.family = body.architecture.family;
  };
  hfConfig.addEventListener("change", importConfig);  // (the sequence length is read then: set it first)
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    errors.replaceChildren();
    const f = form.elements;
    const body = {
      name: f.name.value,
      model: hfModel || examples.models[f.model.value],
      strategy: examples.strategies[f.strategy.value],
      training: examples.training,
      steps: Number(f.steps.value),
      device: "cpu",
    };
    if (f.profile_every && f.profile_every.value !== "") body.profile_every = Number(f.profile_every.value);
    for (const key of ["snapshot_every", "max_restarts"]) if (f[key] && f[key].value !== "") body[key] = Number(f[key].value);
    if (f.inject && f.inject.value.trim()) body.inject = f.inject.value.trim();
    if (f.team) body.team = f.team.value;
    for (const key of ["hf_model", "data"]) if (f[key].value.trim()) body[key] = f[key].value.trim();
    if (body.data && f.data_field.value.trim()) body.data_field = f.data_field.value.trim();
    for (const key of ["val_fraction", "val_every"]) if (Number(f[key].value)) body[key] = Number(f[key].value);
    const button = document.getElementById("launch-button");
    button.disabled = true;
    const r = await postJSON("/api/jobs/", body);
    button.disabled = false;
    if (r.status === 201) { location.assign(`/jobs/${r.body.id}/`); return; }
    showErrorLines(errors, failureLines(r, "launch failed"));
  });
}

export function initJobListPage({ maxCompared = 5, limit = 200 } = {}) {
  const table = new RunTable({ table: document.getElementById("job-table"), rows: null, maxCompared });
  const status = document.getElementById("live-status");
  const client = new LiveClient({
    onStatus: (s) => { status.textContent = s; status.dataset.state = s; },
    onEvent: (e) => live.onEvent(e),
    onNotice: (m) => live.onNotice(m),
    onWatching: (m) => { document.body.dataset.jobsFeed = "watching"; live.onWatching(m); },
  });
  const live = new LiveJobRows({
    client,
    limit,
    rows: JSON.parse(document.getElementById("job-rows").textContent),
    onRows: (ids, added) => table.update(ids, added),
  });
  table.rows = live;
  table.loadFromUrl();
  table.bind();
  table.update([...live.rows.keys()]);
  live.start();
  bindLaunchForm();
  return { table, live, client, TERMINAL };
}
