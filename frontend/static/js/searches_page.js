// The planner's search list (frontend/templates/planning/searches.html): a module of its own, as the Content-Security-Policy allows no inline script
import { formatPercent } from "./common.js";
// the prediction's error relative to the measurement
for (const td of document.querySelectorAll(".rel-error")) {
  const p = parseFloat(td.dataset.predicted), m = parseFloat(td.dataset.measured);
  if (p > 0 && m > 0) td.textContent = formatPercent((p - m) / m);
}
