// The launch options of the plan page (frontend/templates/planning/launch_options.html, one field per option
// of POST /api/jobs/, made by controlplane/jobs/plan_launch.py): read back as a request body holding only the
// fields a person set (an empty one takes the API's default, which the field shows), and the API's 400 shown
// beside the form and beside each field it names.
import { errorEntries, errorText, failureLines, showErrorLines } from "./common.js";

// a field's value as the request holds it, or undefined when it is left at its default
function valueOf(el) {
  const kind = el.dataset.kind;
  if (el.type === "checkbox") {
    if (kind === "object") return el.checked ? {} : undefined;  // a group's box: its fields fill the object
    return el.checked === (el.dataset.default === "true") ? undefined : el.checked;
  }
  const text = el.value.trim();
  if (text === "") return undefined;
  if (kind === "int" || kind === "float") {
    const n = Number(text);
    return Number.isFinite(n) ? n : text;  // not a number: sent as typed, and the API says what it takes
  }
  return text;
}

function put(body, path, value) {
  const keys = path.split(".");
  let node = body;
  for (const k of keys.slice(0, -1)) {
    if (node[k] == null || typeof node[k] !== "object") node[k] = {};
    node = node[k];
  }
  node[keys[keys.length - 1]] = value;
}

// {option: value} of the options set in `form` (a nested object for "energy.pue"); null when the form has no
// options block (the page then sends what it always sent)
export function launchOptions(form) {
  const root = form.querySelector(".launch-options");
  if (!root) return null;
  const body = {};
  for (const el of root.querySelectorAll("[name][data-kind]")) {
    if (el.dataset.suffixOf || el.closest("fieldset:disabled")) continue;  // a group not ticked sends nothing
    const value = valueOf(el);
    if (value !== undefined) put(body, el.name, value);
  }
  // a hook's options go after its name: topk_ef:density=0.01
  for (const el of root.querySelectorAll("[data-suffix-of]")) {
    const extra = el.value.trim();
    if (extra) body[el.dataset.suffixOf] = `${body[el.dataset.suffixOf] || ""}:${extra}`;
  }
  return body;
}

// a ticked group's box opens its fields (a carbon-aware start's deadline, zone, ...)
export function bindLaunchOptions(form) {
  for (const box of form.querySelectorAll("input[data-opens]")) {
    const group = form.querySelector(`fieldset[data-group="${box.dataset.opens}"]`);
    if (!group) continue;
    const sync = () => { group.disabled = !box.checked; };
    box.addEventListener("change", sync);
    sync();
  }
}

// the form field an error names: its own key, else the setting the message names ("energy.pue must ...")
function fieldOf(form, field, message) {
  const named = (name) => (name ? form.querySelector(`[name="${CSS.escape(name)}"]`) : null);
  const inMessage = /^([a-z_]+(?:\.[a-z_]+)+)\b/.exec(message);
  return (inMessage && named(inMessage[1])) || named(field);
}

function labelOf(form, el) {
  const label = el.id ? form.querySelector(`label[for="${CSS.escape(el.id)}"]`) : null;
  return label ? label.textContent.replace(/\(needed\)/, "").trim() : "";
}

// Show a failed launch's answer: one line per message in `list`, each with the field's label beside the API's
// name for it, and the message under the field itself (its options block opened to show it).
export function showLaunchErrors(form, list, response, fallback) {
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  for (const note of form.querySelectorAll(".option-field .field-error")) { note.hidden = true; note.textContent = ""; }
  const entries = errorEntries(response.body);
  if (!entries.length) { showErrorLines(list, failureLines(response, fallback)); return; }
  showErrorLines(list, entries.map((entry) => {
    const el = fieldOf(form, entry.field, entry.message);
    const text = errorText(entry);
    if (!el) return text;
    el.setAttribute("aria-invalid", "true");
    const note = el.closest(".option-field")?.querySelector(".field-error");
    if (note) {
      note.textContent = [note.textContent, entry.message].filter(Boolean).join("; ");
      note.hidden = false;
      const details = el.closest("details");
      if (details) details.open = true;
    }
    const label = labelOf(form, el);
    return label && label !== entry.field ? `${label} — ${text}` : text;
  }));
}
