// The dashboard page (frontend/templates/dashboard.html): a module of its own, as the Content-Security-Policy allows no inline script
import { initDashboard } from "./dashboard.js";
window.dashboard = initDashboard(JSON.parse(document.getElementById("dashboard-lists").textContent));
