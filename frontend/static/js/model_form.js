// The model form (frontend/templates/planning/model_form.html), on the shared document form
// (document_form.js): the MoE part only when ticked, a Hugging Face family's `architecture` kept as the
// document brought it (shown, not edited here), and the import of a config.json (POST
// /api/models/from-hf-config/, which stores the model and opens its page).
import { csrfToken, failureLines, h, showErrorLines } from "./common.js";
import { documentForm, documentToFields, fieldsToDocument } from "./document_form.js";

const data = JSON.parse(document.getElementById("model-form-data").textContent);
const form = document.getElementById("model-form");
const moe = document.getElementById("is-moe");
const text = (n) => (n >= 1e12 ? `${(n / 1e12).toPrecision(3)} T` : n >= 1e9 ? `${(n / 1e9).toPrecision(3)} B`
  : n >= 1e6 ? `${(n / 1e6).toPrecision(3)} M` : n >= 1e3 ? `${(n / 1e3).toPrecision(3)} k` : String(n));
let architecture = null;  // a family's additions (from its config.json), kept as the document had them
const NUMBERS = new Set([...form.querySelectorAll("input[inputmode]")].map((el) => el.name));

function toDocument() {
  const doc = fieldsToDocument(form, { numbers: NUMBERS, skip: (name) => name.startsWith("moe.") && !moe.checked });
  if (!moe.checked) delete doc.moe;
  if (architecture) doc.architecture = architecture;
  return doc;
}

function fill(doc) {
  documentToFields(form, doc);
  moe.checked = Boolean(doc.moe);
  document.getElementById("moe-fields").hidden = !moe.checked;
  architecture = doc.architecture ?? null;
  const note = document.getElementById("architecture-note");
  note.hidden = !architecture;
  note.textContent = architecture ? `Family ${architecture.family}: its architecture (head width, rotary, biases, norms, gating) is kept as imported.` : "";
}

function onChecked({ figures }) {
  const fact = (label, value, id) => h("div", {}, h("span", { class: "muted" }, `${label} `), h("strong", { id }, value));
  document.getElementById("preview-figures").replaceChildren(
    fact("Parameters", text(figures.parameters.total), "preview-params"),
    fact("Active per token", text(figures.active_per_token), "preview-active"),
    fact("Training FLOPs per token", text(figures.flops_per_token.training), "preview-flops"));
}

const checker = documentForm({ form, kind: "models", id: data.id, teams: data.teams, toDocument, fill, onChecked });
moe.addEventListener("change", () => { document.getElementById("moe-fields").hidden = !moe.checked; checker.check(); });

const hf = document.getElementById("hf-form");
if (hf) {
  hf.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const errors = document.getElementById("hf-errors");
    const body = new FormData(hf);
    if (!document.getElementById("hf-file").files.length) { showErrorLines(errors, ["choose the model's config.json"]); return; }
    for (const key of ["name", "seq_length"]) if (!String(body.get(key) || "").trim()) body.delete(key);
    if (form.elements.team.value) body.set("team", form.elements.team.value);
    let r, answer;
    try {
      r = await fetch("/api/models/from-hf-config/", { method: "POST", credentials: "same-origin", body,
                                                        headers: { Accept: "application/json", "X-CSRFToken": csrfToken() } });
      answer = await r.json().catch(() => null);
    } catch { showErrorLines(errors, ["the import failed (no answer)"]); return; }
    if (r.ok) { location.href = `/models/${answer.id}/`; return; }
    showErrorLines(errors, failureLines({ status: r.status, body: answer }, "the config.json was not imported"));
  });
}

fill(data.document);
if (Object.keys(data.document).length) checker.check();
form.dataset.ready = "1";  // filled: what the user types from here on is kept
