// The plan page (frontend/templates/planning/plan_detail.html): a module of its own, as the Content-Security-Policy allows no inline script
import { initPlanPage } from "./visualizer.js";
initPlanPage();
