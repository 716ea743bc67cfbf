// The failure patterns page: import an incident list (CSV) into the team's knowledge base through
// POST /api/failure-patterns/incidents/ (the file's text as JSON), then reload the page with the counts it
// added and say what was imported.

import { failureLines, postJSON, showErrorLines } from "./common.js";

const DONE_KEY = "failure-patterns-import";

export function importSummary(body) {
  const kinds = Object.entries(body.patterns || {}).map(([key, n]) => `${key} ${n}`).join(", ");
  const dup = body.duplicates ? `, ${body.duplicates} already known` : "";
  return `${body.source}: ${body.imported} of ${body.rows} incidents imported${dup}${kinds ? ` (${kinds})` : ""}.`;
}

export function initFailurePatternImport(page) {
  const form = document.getElementById("incident-form");
  const errors = document.getElementById("incident-errors");
  const result = document.getElementById("incident-result");
  const button = document.getElementById("incident-submit");
  const done = sessionStorage.getItem(DONE_KEY);
  if (done) {
    sessionStorage.removeItem(DONE_KEY);
    result.textContent = done;
    result.hidden = false;
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    result.hidden = true;
    const data = new FormData(form);
    const file = data.get("file");
    if (!file || !file.size) {
      showErrorLines(errors, ["choose an incident list (CSV) first"]);
      return;
    }
    if (file.size > page.max_chars) {
      showErrorLines(errors, [`${file.name}: larger than ${page.max_chars.toLocaleString("en-US")} bytes, split the list`]);
      return;
    }
    const body = { csv: await file.text(), source_name: file.name };
    if (data.get("team")) body.team = data.get("team");
    button.disabled = true;
    const r = await postJSON(page.api, body);
    button.disabled = false;
    if (!r.ok) {
      showErrorLines(errors, failureLines(r, "the import failed"));
      return;
    }
    sessionStorage.setItem(DONE_KEY, importSummary(r.body));
    window.location.reload();
  });
}
