// The job list page (frontend/templates/jobs/list.html): a module of its own, as the Content-Security-Policy allows no inline script
import { initJobListPage } from "./job_list.js";

const options = document.getElementById("job-list-options").dataset;
window.jobList = initJobListPage({ maxCompared: Number(options.maxCompared), limit: Number(options.limit) });
