// What a person does on the job page: cancel, relaunch (or start a scheduled job now), download the energy
// and carbon report, restore from a snapshot. Each posts to the job API and the page (JobDetail,
// job_detail.js) shows the state the answer says; a refused action says why under the buttons.
import { failureLines, postJSON } from "./common.js";
import { TERMINAL } from "./job_rows.js";

export function showActionError(text) {
  const el = document.getElementById("action-error");
  el.textContent = text;
  el.hidden = !text;
}

// `detail`: the page's JobDetail
export function bindJobActions(detail) {
  const el = (id) => document.getElementById(id);
  const api = detail.page.api;
  const cancel = el("cancel-button");
  cancel.addEventListener("click", async () => {
    // a cancel stops every rank of a running job: asked once (its snapshots are kept: a relaunch or a restore
    // goes on from them)
    const sure = window.confirm("Cancel this job? Its ranks are stopped now; its snapshots are kept, so it can be " +
      "relaunched or restored later.");
    if (!sure) return;
    cancel.disabled = true;
    showActionError("");
    const r = await postJSON(`${api}cancel/`);
    if (!r.ok) { cancel.disabled = false; showActionError(failureLines(r, "cancel failed").join(" ")); return; }
    cancel.textContent = TERMINAL.has(r.body.state) ? "Cancel" : "Cancelling…";
    if (TERMINAL.has(r.body.state)) { detail.setState(r.body.state); detail.refresh(); }
  });
  const relaunch = el("relaunch-button");
  relaunch.addEventListener("click", async () => {
    relaunch.disabled = true;
    showActionError("");
    const r = await postJSON(`${api}relaunch/`);
    relaunch.disabled = false;
    if (!r.ok) { showActionError(failureLines(r, "relaunch failed").join(" ")); return; }
    cancel.textContent = "Cancel";
    detail.measured = null;
    detail.row = null;
    detail.setState(r.body.state);
    el("job-attempts").textContent = r.body.attempts;
    el("job-error").hidden = true;
    detail.figures();
  });
  // the energy and carbon report: issued on the first click (or the one issued before), then downloaded
  const report = el("report-button");
  report.addEventListener("click", async () => {
    report.disabled = true;
    showActionError("");
    const r = await postJSON(`${api}certificate/`);
    report.disabled = false;
    if (!r.ok) { showActionError(failureLines(r, "the report could not be issued").join(" ")); return; }
    const code = el("report-code");
    code.replaceChildren("code ", Object.assign(document.createElement("code"), { textContent: r.body.code }), " · ",
      Object.assign(document.createElement("a"), { href: r.body.page_url, textContent: "verify" }));
    code.dataset.code = r.body.code;
    report.textContent = "Download the energy and carbon report (PDF)";
    const a = Object.assign(document.createElement("a"), { href: r.body.pdf_url, download: "" });
    document.body.append(a);
    a.click();
    a.remove();
  });
  // "Restore from this snapshot": a new attempt continues from exactly that snapshot
  el("snapshot-table").addEventListener("click", async (ev) => {
    const button = ev.target.closest("button.restore-button");
    if (!button || button.disabled) return;
    const name = button.dataset.snapshot;
    const snap = detail.recovery.snapshots.get(name) || {};
    const ok = window.confirm(`Restore job #${detail.page.id} from ${name} (step ${snap.step})? A new attempt ` +
      "continues training from that step; the newer snapshots are set aside.");
    if (!ok) return;
    button.disabled = true;
    showActionError("");
    const r = await postJSON(`${api}restore/`, { snapshot: name });
    if (!r.ok) { button.disabled = false; showActionError(failureLines(r, "restore failed").join(" ")); return; }
    cancel.textContent = "Cancel";
    detail.measured = null;
    detail.row = null;
    detail.recovery.goodput = null;
    detail.setState(r.body.state);
    el("job-attempts").textContent = r.body.attempts;
    el("job-error").hidden = true;
    detail.recovery.renderGoodput();
    detail.figures();
  });
}
