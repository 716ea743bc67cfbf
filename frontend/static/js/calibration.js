// This machine's calibration (the banner on every page, the planner page's card): the button asks
// /api/calibration/ to start one, and while one runs the text follows its progress every 2 s; once done
// the page says so (plans made before keep their prediction and its "uncalibrated" note).
import { failureLines, getJSON, postJSON, showErrorLines } from "./common.js";

const API = "/api/calibration/";

function render(box, s) {
  box.dataset.state = s.state || "";
  box.dataset.calibrated = String(Boolean(s.calibrated));
  const text = box.querySelector(".calibration-text");
  const button = box.querySelector(".calibrate-button");
  button.disabled = Boolean(s.running);
  button.textContent = s.calibrated ? "Calibrate again" : "Calibrate now";
  if (s.running) {
    text.textContent = `Calibrating this machine for the planner: ${s.what || "queued"} (${Math.round(100 * (s.fraction || 0))}%).`;
  } else if (s.state === "failed") {
    text.textContent = `The calibration failed: ${s.error}. Predictions for this machine stay ${s.calibrated ? "on its earlier calibration" : "uncalibrated"}.`;
  } else if (!s.calibrated) {
    text.textContent = "Uncalibrated: predictions for this machine (this-machine-cpu) use a placeholder CPU profile and can be many times off.";
  } else if (s.calibrated) {
    text.textContent = `Calibrated${s.measured_at ? ` at ${s.measured_at}` : ""}: plans made from now on predict from this machine's measured figures (plans made before keep theirs).${s.note ? ` ${s.note}.` : ""}`;
  }
}

async function follow(boxes) {
  for (;;) {
    const r = await getJSON(API);
    if (r.ok) boxes.forEach((box) => render(box, r.body));
    if (!r.ok || !r.body.running) return;
    await new Promise((done) => setTimeout(done, 2000));
  }
}

function init() {
  const boxes = [...document.querySelectorAll("[data-calibration]")];
  if (!boxes.length || document.body.dataset.calibrationBound) return;
  document.body.dataset.calibrationBound = "1";
  for (const box of boxes) {
    box.querySelector(".calibrate-button").addEventListener("click", async () => {
      const errors = box.querySelector(".calibration-errors");
      errors.replaceChildren();
      const r = await postJSON(API, {});
      if (!r.ok) { showErrorLines(errors, failureLines(r, "the calibration could not start")); return; }
      boxes.forEach((b) => render(b, r.body));
      follow(boxes);
    });
  }
  if (boxes.some((box) => box.dataset.state === "queued" || box.dataset.state === "running")) follow(boxes);
}

init();
