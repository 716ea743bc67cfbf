// The cluster form (frontend/templates/clusters/cluster_form.html): fields named by their path in cluster.json,
// checked by the planner as the user types (POST /api/clusters/validate/: its messages go beside their field,
// its totals and drawing into the preview), then created (POST /api/clusters/) or saved (PUT /api/clusters/<id>/).
import { csrfToken, errorLines, failureLines, formatNumber, h, requestJSON, showErrorLines } from "./common.js";
import { drawTopology } from "./topology.js";

const data = JSON.parse(document.getElementById("cluster-form-data").textContent);
const form = document.getElementById("cluster-form");
const tierRows = document.querySelector("#tier-rows tbody");
const NUMBERS = new Set(["num_nodes", "devices_per_node", "device.memory_GiB", "device.memory_bandwidth_GBps",
  "device.tdp_watts", "intra_node.bandwidth_GBps", "intra_node.latency_us", "inter_node.bandwidth_GBps", "inter_node.latency_us"]);

// ------------------------------------------------------------------------------ document <-> form

// a typed number, or the text as typed (the planner then names the field: "must be a number, got 'abc'")
const value = (text) => (text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : text.trim());

function parsePeak(text) {
  const out = {};
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const m = part.match(/^([\w.-]+)\s*[=:]\s*(.+)$/);
    if (!m) return text;  // not dtype=value pairs: sent as typed, the planner says what it must be
    out[m[1]] = value(m[2]);
  }
  return out;
}

function addTier(tier = {}) {
  const i = tierRows.children.length;
  const cell = (key, v, mode) => h("td", {}, h("input", { name: `tiers[${i}].${key}`, value: v ?? "", inputmode: mode }),
                                   h("span", { class: "field-error", dataset: { for: `tiers[${i}].${key}` } }));
  const remove = h("button", { type: "button", class: "link", onclick: () => { row.remove(); renumber(); check(); } }, "remove");
  const row = h("tr", {}, cell("name", tier.name), cell("nodes", tier.nodes, "numeric"),
                cell("oversubscription", tier.oversubscription ?? 1, "decimal"), h("td", {}, remove));
  tierRows.append(row);
}

function renumber() {
  [...tierRows.children].forEach((row, i) => {
    for (const el of row.querySelectorAll("[name]")) el.name = el.name.replace(/^tiers\[\d+\]/, `tiers[${i}]`);
    for (const el of row.querySelectorAll(".field-error")) el.dataset.for = el.dataset.for.replace(/^tiers\[\d+\]/, `tiers[${i}]`);
  });
}

function documentOfForm() {
  const doc = {};
  for (const el of form.querySelectorAll("input[name]")) {
    if (el.name.startsWith("tiers[") || el.value.trim() === "") continue;
    const path = el.name.split(".");
    const v = el.name === "device.peak_tflops" ? parsePeak(el.value) : NUMBERS.has(el.name) ? value(el.value) : el.value.trim();
    let at = doc;
    for (const key of path.slice(0, -1)) at = at[key] ??= {};
    at[path.at(-1)] = v;
  }
  doc.tiers = [...tierRows.children].map((row) => {
    const t = {};
    for (const el of row.querySelectorAll("input[name]")) {
      const key = el.name.split(".").at(-1);
      if (el.value.trim() !== "") t[key] = key === "name" ? el.value.trim() : value(el.value);
    }
    return t;
  });
  return doc;
}

function fillForm(doc) {
  for (const el of form.querySelectorAll("input[name]")) {
    if (el.name.startsWith("tiers[")) continue;
    let v = doc;
    for (const key of el.name.split(".")) v = v == null ? undefined : v[key];
    if (el.name === "device.peak_tflops" && v && typeof v === "object") v = Object.entries(v).map(([k, x]) => `${k}=${x}`).join(", ");
    el.value = v ?? "";
  }
  tierRows.replaceChildren();
  for (const t of Array.isArray(doc.tiers) ? doc.tiers : []) addTier(t);
}

function body() {
  const doc = documentOfForm();
  if (!data.id && form.elements.team.value) doc.team = form.elements.team.value;
  return doc;
}

// ------------------------------------------------------------------------------ checking

function showErrors(errors) {
  for (const el of form.querySelectorAll(".field-error")) el.textContent = "";
  const unplaced = [];
  const targets = [...form.querySelectorAll(".field-error")].map((el) => [el.dataset.for, el]);
  for (const [field, messages] of Object.entries(errors || {})) {
    const lines = errorLines(messages);
    // the field itself, else the closest field it sits in (device.peak_tflops.bf16 -> device.peak_tflops)
    const hit = targets.filter(([path]) => field === path || field.startsWith(`${path}.`) || field.startsWith(`${path}[`))
      .sort((a, b) => b[0].length - a[0].length)[0];
    if (hit) hit[1].textContent = (hit[1].textContent ? `${hit[1].textContent}; ` : "") + lines.join("; ");
    else unplaced.push(...lines.map((l) => (field === "non_field_errors" || field === "detail" ? l : `${field}: ${l}`)));
  }
  showErrorLines(document.getElementById("form-errors"), unplaced);
}

function showPreview(figures, drawing) {
  const peak = Object.entries(figures.peak_tflops).map(([k, v]) => `${formatNumber(v)} TFLOP/s ${k}`).join(" · ");
  document.getElementById("preview-figures").replaceChildren(
    h("div", {}, h("span", { class: "muted" }, "Devices "), h("strong", {}, String(figures.devices)), ` (${figures.nodes} × ${figures.devices_per_node})`),
    h("div", {}, h("span", { class: "muted" }, "Peak "), peak),
    h("div", {}, h("span", { class: "muted" }, "Memory "), `${formatNumber(figures.memory_GiB)} GiB`),
    h("div", {}, h("span", { class: "muted" }, "Bisection bandwidth "), h("strong", { id: "preview-bisection" }, formatNumber(figures.bisection_GBps)), " GB/s per direction"));
  drawTopology(document.getElementById("topology-drawing"), drawing);
}

const checkUrl = `/api/clusters/validate/${data.id ? `?id=${data.id}` : ""}`;
const state = document.getElementById("check-state");
let pending = null, latest = 0;

async function check() {
  const mine = ++latest;
  state.textContent = "checking…";
  const r = await requestJSON("POST", checkUrl, body());
  if (mine !== latest) return null;  // a newer check is on its way
  if (r.ok) {
    showErrors({});
    showPreview(r.body.figures, r.body.drawing);
    state.textContent = "the planner reads it";
  } else {
    showErrors(r.status === 400 ? r.body : { detail: failureLines(r, "the check failed") });
    state.textContent = r.status === 400 ? "see the fields marked" : "";
  }
  return r;
}

form.addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(check, 300); });
document.getElementById("add-tier").addEventListener("click", () => { addTier(); check(); });

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  clearTimeout(pending);
  const r = await requestJSON(data.id ? "PUT" : "POST", data.id ? `/api/clusters/${data.id}/` : "/api/clusters/", body());
  if (r.ok) { location.href = `/clusters/${r.body.id}/`; return; }
  showErrors(r.status === 400 ? r.body : { detail: failureLines(r, "the cluster was not saved") });
  state.textContent = "not saved: see the fields marked";
});

// ------------------------------------------------------------------------------ starting points

const profiles = document.getElementById("start-profile");
for (const p of data.profiles) profiles.append(h("option", { value: p.name }, p.name));
profiles.addEventListener("change", () => {
  const p = data.profiles.find((x) => x.name === profiles.value);
  if (!p) return;
  const s = p.spec, set = (name, v) => { if (v != null) form.elements[name].value = v; };
  set("device.name", s.name || p.name);
  if (s.peak_tflops) set("device.peak_tflops", Object.entries(s.peak_tflops).map(([k, x]) => `${k}=${x}`).join(", "));
  set("device.memory_GiB", s.memory_GiB);
  set("device.memory_bandwidth_GBps", s.memory_bandwidth_GBps);
  set("device.tdp_watts", s.tdp_watts);
  set("devices_per_node", s.devices_per_node);
  set("intra_node.bandwidth_GBps", s.scale_up_GBps_per_direction);
  document.getElementById("start-note").textContent = `device figures from the profile ${p.name}`;
  check();
});

document.getElementById("start-this-machine").addEventListener("click", () => {
  fillForm({ ...data.this_machine.document, name: form.elements.name.value || data.this_machine.document.name });
  document.getElementById("start-note").textContent = `this machine: ${data.this_machine.origin}`;
  check();
});

// a pasted or uploaded document: JSON fills the form as it is (the check then marks its fields); YAML is read
// by the API's own parser (its YAML errors, or the planner's, listed under the text)
async function loadDocument() {
  const text = document.getElementById("document-text").value;
  const errors = document.getElementById("document-errors");
  let doc = null;
  try { doc = JSON.parse(text); } catch { /* YAML, or not a document: the API says which */ }
  if (doc === null) {
    let r;
    try {
      r = await fetch(checkUrl, { method: "POST", credentials: "same-origin", body: text,
                                  headers: { "Content-Type": "application/yaml", Accept: "application/json", "X-CSRFToken": csrfToken() } });
    } catch { showErrorLines(errors, ["the check failed (no answer)"]); return; }
    const answer = await r.json().catch(() => null);
    if (!r.ok) { showErrorLines(errors, failureLines({ status: r.status, body: answer }, "the document was not read")); return; }
    doc = answer.document;
  }
  if (typeof doc !== "object" || Array.isArray(doc)) { showErrorLines(errors, ["a cluster.json is one object {name, num_nodes, …}"]); return; }
  showErrorLines(errors, []);
  fillForm(data.id ? { ...doc, name: doc.name ?? form.elements.name.value } : doc);
  check();
}
document.getElementById("load-document").addEventListener("click", loadDocument);
document.getElementById("document-file").addEventListener("change", async (ev) => {
  const file = ev.target.files[0];
  if (!file) return;
  document.getElementById("document-text").value = await file.text();
  loadDocument();
});

// ------------------------------------------------------------------------------ start

if (data.teams.length > 1 && !data.id) {
  document.getElementById("team-field").hidden = false;
  for (const t of data.teams) form.elements.team.append(h("option", { value: t.slug }, t.name));
}
fillForm(data.document);
if (Object.keys(data.document).length) check();
form.dataset.ready = "1";  // filled: what the user types from here on is kept
