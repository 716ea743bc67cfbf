// The tags-and-notes editor of a job (the jobs page and the job page): a dialog that PATCHes
// /api/jobs/<id>/ with {tags, notes}. Tags are typed comma-separated; the server checks them (at most 20
// of 1-40 characters, no control characters; notes up to 10,000 characters) and its 400 is shown as is.
import { failureLines, h, requestJSON, showErrorLines } from "./common.js";

export const NOTES_MAX = 10000;

// "a, b ,, c" -> ["a", "b", "c"] (empty pieces from stray commas dropped; the rest is the server's to judge)
export function parseTags(text) {
  return text.split(",").map((t) => t.trim()).filter((t) => t.length);
}

let dialog = null;

function build() {
  const tags = h("input", { name: "tags", id: "annotate-tags", autocomplete: "off", placeholder: "comma-separated, e.g. baseline, lr-sweep" });
  const notes = h("textarea", { name: "notes", id: "annotate-notes", rows: 6, maxlength: NOTES_MAX,
                                placeholder: "what this run tries, what came out of it" });
  const errors = h("ul", { class: "error", id: "annotate-errors" });
  const title = h("h2", { id: "annotate-title" });
  const save = h("button", { type: "submit", id: "annotate-save" }, "Save");
  const cancel = h("button", { type: "button", class: "link", id: "annotate-cancel" }, "Cancel");
  const form = h("form", { method: "dialog", id: "annotate-form" },
    title,
    h("label", { for: "annotate-tags" }, "Tags ", h("span", { class: "muted" }, "(comma-separated; at most 20, each 1–40 characters)")), tags,
    h("label", { for: "annotate-notes" }, "Notes ", h("span", { class: "muted" }, `(at most ${NOTES_MAX.toLocaleString("en-US")} characters)`)), notes,
    errors, h("div", { class: "inline" }, save, cancel));
  const d = h("dialog", { id: "annotate-dialog", class: "annotate", "aria-labelledby": "annotate-title" }, form);
  document.body.append(d);
  return { d, form, tags, notes, errors, title, save, cancel };
}

// Open the editor for a job ({id, name, tags, notes}); resolves with the saved job (the API's answer),
// or null when the user cancels.
export function editAnnotations(job) {
  dialog = dialog || build();
  const { d, form, tags, notes, errors, title, save, cancel } = dialog;
  title.textContent = `Tags and notes of job #${job.id} ${job.name || ""}`.trim();
  tags.value = (job.tags || []).join(", ");
  notes.value = job.notes || "";
  errors.replaceChildren();
  return new Promise((resolve) => {
    const done = (result) => {
      form.onsubmit = null;
      cancel.onclick = null;
      d.onclose = null;
      if (d.open) d.close();
      resolve(result);
    };
    form.onsubmit = async (ev) => {
      ev.preventDefault();
      save.disabled = true;
      const r = await requestJSON("PATCH", `/api/jobs/${job.id}/`, { tags: parseTags(tags.value), notes: notes.value });
      save.disabled = false;
      if (r.ok) { done(r.body); return; }
      showErrorLines(errors, failureLines(r, "saving failed"));
    };
    cancel.onclick = () => done(null);
    d.onclose = () => done(null);
    d.showModal();
    tags.focus();
  });
}

// The job page's "Tags and notes" card: shows them, and the edit button opens the editor.
export function bindJobAnnotations(job) {
  const tagsEl = document.getElementById("job-tags");
  const notesEl = document.getElementById("job-notes");
  const render = () => {
    tagsEl.replaceChildren(...(job.tags.length ? job.tags.map((t) => h("span", { class: "tag", dataset: { tag: t } }, t))
      : [h("span", { class: "muted" }, "no tags")]));
    notesEl.replaceChildren(job.notes ? job.notes : h("span", { class: "muted" }, "no notes"));
  };
  document.getElementById("annotate-button").addEventListener("click", async () => {
    const saved = await editAnnotations(job);
    if (!saved) return;
    job.tags = saved.tags;
    job.notes = saved.notes;
    render();
  });
  render();
}
