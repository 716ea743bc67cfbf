// The job comparison page (frontend/templates/jobs/compare.html): the loss and tokens/s of the chosen jobs
// side by side, from their stored series, then live for the ones still running.
import { LiveClient } from "./live.js";
import { COLORS, PLOT_CONFIG, TraceAppender, chartLayout } from "./charts.js";
import { JOB_STATES } from "./event_text.js";
import { setStatePill } from "./job_detail.js";
import { AttemptTracker } from "./job_series.js";

// One line per job and attempt: a relaunch is a line of its own (it starts again at step 1, a restore at the
// step after its snapshot), never joined
// to the attempt before it. Profiled steps are left out of the tokens/s lines (the profiler slows them).
export function initCompare(series) {
  const lossDiv = document.getElementById("compare-loss");
  const tokensDiv = document.getElementById("compare-tokens");
  const lines = [];           // trace index -> {job index, attempt}
  const traceOf = new Map();  // `${stream}#${attempt}` -> trace index
  const attemptsOf = (i) => lines.filter((l) => l.i === i).length;
  const nameOf = (s, attempt, many) => `#${s.id} ${s.name} (${s.strategy})` + (many ? ` · attempt ${attempt}` : "");
  const initial = { loss: [], tokens: [] };
  series.forEach((s, i) => {
    const attempts = [...new Set(s.attempt && s.attempt.length ? s.attempt : [1])].sort((a, b) => a - b);
    for (const attempt of attempts) {
      const at = s.step.map((_, k) => k).filter((k) => ((s.attempt || [])[k] ?? 1) === attempt);
      const trace = (ys, keep = () => true) => {
        const kept = at.filter(keep);
        return {
          type: "scatter", mode: "lines", name: nameOf(s, attempt, attempts.length > 1),
          x: kept.map((k) => s.step[k]), y: kept.map((k) => ys[k]),
          line: { color: COLORS[i % COLORS.length], width: 2, dash: ["solid", "dot", "dash", "dashdot"][(attempt - 1) % 4] },
          connectgaps: false, legendgroup: `job-${s.id}`,
        };
      };
      traceOf.set(`${s.stream}#${attempt}`, lines.length);
      lines.push({ i, attempt });
      initial.loss.push(trace(s.loss));
      initial.tokens.push(trace(s.tokens_per_s, (k) => !(s.profiled || [])[k]));
    }
  });
  Plotly.newPlot(lossDiv, initial.loss, chartLayout({ yTitle: "loss", uirevision: "compare" }), PLOT_CONFIG);
  Plotly.newPlot(tokensDiv, initial.tokens, chartLayout({ yTitle: "tokens/s", uirevision: "compare" }), PLOT_CONFIG);
  const running = series.filter((s) => !s.finished);
  const page = { lossDiv, tokensDiv, series };
  if (!running.length) { document.getElementById("live-status").textContent = "all finished"; return page; }
  const index = new Map(series.map((s, i) => [s.stream, i]));
  const trackers = new Map(series.map((s) => {
    const t = new AttemptTracker();
    t.current = Math.max(s.attempts || 0, ...(s.attempt || []));
    return [s.stream, t];
  }));
  const lastStep = new Map();
  for (const [key, t] of traceOf) {
    const x = initial.loss[t].x;
    lastStep.set(key, x.length ? x[x.length - 1] : null);
  }
  const loss = new TraceAppender(lossDiv);
  const tokens = new TraceAppender(tokensDiv);
  // a new attempt of a job: a line of its own; the job's first line now says which attempt it is
  const addLine = (i, attempt) => {
    const s = series[i];
    loss.flush(); tokens.flush();
    if (attemptsOf(i) === 1) {
      const first = lines.findIndex((l) => l.i === i);
      const name = nameOf(s, lines[first].attempt, true);
      Plotly.restyle(lossDiv, { name }, [first]);
      Plotly.restyle(tokensDiv, { name }, [first]);
    }
    const trace = {
      type: "scatter", mode: "lines", name: nameOf(s, attempt, attemptsOf(i) > 0), x: [], y: [],
      line: { color: COLORS[i % COLORS.length], width: 2, dash: ["solid", "dot", "dash", "dashdot"][(attempt - 1) % 4] },
      connectgaps: false, legendgroup: `job-${s.id}`,
    };
    Plotly.addTraces(lossDiv, trace);
    Plotly.addTraces(tokensDiv, { ...trace });
    traceOf.set(`${s.stream}#${attempt}`, lines.length);
    lines.push({ i, attempt });
    return lines.length - 1;
  };
  page.client = new LiveClient({
    onStatus: (st) => { const el = document.getElementById("live-status"); el.textContent = st; el.dataset.state = st; },
    onEvent: (e) => {
      const i = index.get(e.stream);
      const attempt = trackers.get(e.stream).of(e);
      if (e.kind === "train") {
        const key = `${e.stream}#${attempt}`;
        const t = traceOf.has(key) ? traceOf.get(key) : addLine(i, attempt);
        const prev = lastStep.get(key);
        if (prev != null && e.step <= prev) { loss.push(t, null, null); tokens.push(t, null, null); }
        lastStep.set(key, e.step);
        loss.push(t, e.step, e.values.loss ?? null);
        if (!e.values.profiled) tokens.push(t, e.step, e.values.tokens_per_s ?? null);
      } else if (e.kind === "event" && JOB_STATES.has(e.values?.state)) {
        const pill = document.querySelector(`#compared-jobs tr[data-job="${series[i].id}"] .state`);
        if (pill) setStatePill(pill, e.values.state);
      }
    },
  });
  for (const s of running) page.client.subscribe(s.stream, s.last_seq);
  return page;
}
