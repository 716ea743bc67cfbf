// A form for one contract document (cluster.json, model.json): inputs named by their path in the document,
// checked by the planner as the user types (POST <kind>/validate/: its messages go beside their field, and
// what it answers to onChecked), then created (POST) or saved (PUT); a pasted or uploaded JSON/YAML fills it.
// The page's own module says how the document maps to its fields (toDocument, fill).
import { csrfToken, errorLines, failureLines, requestJSON, showErrorLines } from "./common.js";

// a typed number, or the text as typed (the planner then names the field: "must be a number, got 'abc'")
export const value = (text) => (text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : text.trim());

// every input or select with a name, outside the given prefixes' rows, into a nested document
export function fieldsToDocument(form, { numbers = new Set(), skip = () => false, convert = {} } = {}) {
  const doc = {};
  for (const el of form.querySelectorAll("input[name], select[name]")) {
    if (skip(el.name) || el.name === "team") continue;
    let v;
    if (el.type === "checkbox") v = el.checked;
    else if (el.value.trim() === "") continue;
    else v = convert[el.name] ? convert[el.name](el.value) : numbers.has(el.name) ? value(el.value) : el.value.trim();
    const path = el.name.split(".");
    let at = doc;
    for (const key of path.slice(0, -1)) at = at[key] ??= {};
    at[path.at(-1)] = v;
  }
  return doc;
}

export function documentToFields(form, doc, { skip = () => false, show = {} } = {}) {
  for (const el of form.querySelectorAll("input[name], select[name]")) {
    if (skip(el.name) || el.name === "team") continue;
    let v = doc;
    for (const key of el.name.split(".")) v = v == null ? undefined : v[key];
    if (show[el.name]) v = show[el.name](v);
    if (el.tagName === "SELECT" && v == null) { el.selectedIndex = 0; continue; }  // the document's default
    if (el.type === "checkbox") el.checked = Boolean(v);
    else el.value = v ?? "";
  }
}

export function showErrors(form, errors, list) {
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
  showErrorLines(list, unplaced);
}

// wires the form: {form, kind ("clusters" | "models"), id (null: a new one), teams, toDocument(), fill(doc),
// onChecked(answer)}; returns {check}
export function documentForm({ form, kind, id, teams, toDocument, fill, onChecked }) {
  const checkUrl = `/api/${kind}/validate/${id ? `?id=${id}` : ""}`;
  const state = document.getElementById("check-state");
  const errorsList = document.getElementById("form-errors");
  let pending = null, latest = 0;

  const body = () => {
    const doc = toDocument();
    if (!id && form.elements.team && form.elements.team.value) doc.team = form.elements.team.value;
    return doc;
  };

  async function check() {
    const mine = ++latest;
    state.textContent = "checking…";
    const r = await requestJSON("POST", checkUrl, body());
    if (mine !== latest) return null;  // a newer check is on its way
    if (r.ok) {
      showErrors(form, {}, errorsList);
      onChecked(r.body);
      state.textContent = "the planner reads it";
    } else {
      showErrors(form, r.status === 400 ? r.body : { detail: failureLines(r, "the check failed") }, errorsList);
      state.textContent = r.status === 400 ? "see the fields marked" : "";
    }
    return r;
  }

  form.addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(check, 300); });
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearTimeout(pending);
    ++latest;  // a check still on its way must not overwrite what the save says
    const r = await requestJSON(id ? "PUT" : "POST", id ? `/api/${kind}/${id}/` : `/api/${kind}/`, body());
    if (r.ok) { location.href = `/${kind}/${r.body.id}/`; return; }
    showErrors(form, r.status === 400 ? r.body : { detail: failureLines(r, "not saved") }, errorsList);
    state.textContent = "not saved: see the fields marked";
  });

  // a pasted or uploaded document: JSON fills the form as it is (the check then marks its fields); YAML is
  // read by the API's own parser (its YAML errors, or the planner's, listed under the text)
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
    if (typeof doc !== "object" || doc === null || Array.isArray(doc)) { showErrorLines(errors, ["the document is one object {name, …}"]); return; }
    showErrorLines(errors, []);
    fill(id ? { ...doc, name: doc.name ?? form.elements.name.value } : doc);
    check();
  }
  document.getElementById("load-document").addEventListener("click", loadDocument);
  document.getElementById("document-file").addEventListener("change", async (ev) => {
    const file = ev.target.files[0];
    if (!file) return;
    document.getElementById("document-text").value = await file.text();
    loadDocument();
  });

  if (teams.length > 1 && !id) {
    document.getElementById("team-field").hidden = false;
    for (const t of teams) {
      const o = document.createElement("option");
      o.value = t.slug;
      o.textContent = t.name;
      form.elements.team.append(o);
    }
  }
  return { check };
}
