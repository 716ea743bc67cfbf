// The job comparison page (frontend/templates/jobs/compare.html): a module of its own, as the Content-Security-Policy allows no inline script
import { initCompare } from "./jobs.js";
window.comparePage = initCompare(JSON.parse(document.getElementById("compare-series").textContent));
