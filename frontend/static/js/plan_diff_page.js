// The plan comparison page (frontend/templates/planning/plan_diff.html): a module of its own, as the Content-Security-Policy allows no inline script
import { initDiffPage } from "./visualizer.js";
initDiffPage();
