// The job page (frontend/templates/jobs/detail.html): a module of its own, as the Content-Security-Policy allows no inline script
import { bindJobAnnotations } from "./annotate.js";
import { initCommCompare } from "./comm_compare.js";
import { initJobDetail } from "./jobs.js";
import { initRankMetrics } from "./rank_metrics.js";

const data = (id) => JSON.parse(document.getElementById(id).textContent);
const annotations = document.getElementById("job-annotations").dataset;
bindJobAnnotations({ id: Number(annotations.jobId), name: annotations.jobName, tags: data("job-tags-data"), notes: data("job-notes-data") });
window.rankMetrics = initRankMetrics(data("job-page"));
window.jobPage = initJobDetail(data("job-page"));
initCommCompare(data("comm-compare-data"));
