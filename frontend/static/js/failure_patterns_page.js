// The failure-pattern list page (frontend/templates/failures/failure_patterns.html): a module of its own, as the Content-Security-Policy allows no inline script
import { initFailurePatternImport } from "./failure_patterns.js";
initFailurePatternImport(JSON.parse(document.getElementById("pattern-page").textContent));
