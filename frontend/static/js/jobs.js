// The job pages' entry points, for their page modules (job_page.js, job_compare_page.js; the job list is
// job_list.js). The job page is split by concern:
//   job_detail.js   JobDetail: history then live, the job's state, predicted vs measured figures
//   job_series.js   which attempt an event belongs to; each attempt's chart series (no drawing)
//   job_charts.js   loss, tokens/s, step-time split, memory and expert charts; fault markers
//   job_faults.js   elastic recovery: faults, snapshots, goodput
//   job_energy.js   energy and carbon
//   job_log.js      the live log and the events timeline
//   job_actions.js  cancel, relaunch, report, restore
// and the comparison page is job_compare.js.
export { initCompare } from "./job_compare.js";
export { initJobDetail } from "./job_detail.js";
export { AttemptTracker } from "./job_series.js";
