// The search page (frontend/templates/planning/search_detail.html): a module of its own, as the Content-Security-Policy allows no inline script
import { initSearchPage } from "./visualizer.js";
initSearchPage();
