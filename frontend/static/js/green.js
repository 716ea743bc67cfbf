// The green page (frontend/templates/green/index.html): a module of its own, as the Content-Security-Policy allows no inline script
import { requestJSON, getJSON, postJSON, failureLines, showErrorLines, h, formatNumber, MISSING } from "./common.js";
import { PLOT_CONFIG, chartLayout, COLORS, loadPlotly } from "./charts.js";

const page = JSON.parse(document.getElementById("green-page").textContent);
const form = document.getElementById("schedule-form");
const errors = document.getElementById("schedule-errors");
const listErrors = document.getElementById("schedule-list-errors");
const tbody = document.querySelector("#schedule-list tbody");
const emptyRow = tbody.querySelector(".empty-row");

// "2020-06-01T04:00:00+00:00" -> "2020-06-01 04:00 UTC" (the engine answers in UTC)
const utc = (s) => (s ? `${String(s).replace("T", " ").slice(0, 16)} UTC` : MISSING);
const hours = (a, b) => (Date.parse(b) - Date.parse(a)) / 3.6e6;
const intensityLabel = (r) => `${r.intensity.provider} · ${r.history_used_as_forecast ? "history used as a forecast" : r.intensity.kind}`;

function provenance(row) {
  const r = row.result;
  const i = r.intensity;
  const lines = [
    h("strong", {}, r.history_used_as_forecast ? "Measured history used as a forecast" : `Intensity: ${i.kind}`),
    ` — ${i.provider}, zone ${i.zone}, ${utc(i.start)} to ${utc(i.end)} (${i.points} points): ${i.source}. `,
    `Ready ${utc(r.now)} (${row.request.now_source}), finish by ${utc(r.finish_by)}; objective ${r.objective}.`,
  ];
  if (r.price) lines.push(` Price: ${r.price.kind} ${r.price.price_per_kwh ?? ""} ${r.price.currency || ""}/kWh (${r.price.source}).`);
  return lines;
}

function fact(label, ...value) {
  return h("div", {}, h("dt", {}, label), h("dd", {}, ...value));
}

function showResult(row) {
  const r = row.result;
  const label = r.history_used_as_forecast ? " (history as forecast)" : ` (${r.intensity.kind})`;
  document.getElementById("schedule-result").hidden = false;
  document.getElementById("result-name").textContent = `#${row.id} ${row.name}`;
  document.getElementById("result-provenance").replaceChildren(...provenance(row));
  const facts = [
    fact("Start", utc(r.start)),
    fact("Slots", ...r.slots.map(([a, b], k) => h("div", {}, `${utc(a)} → ${utc(b).slice(11)} (${formatNumber(hours(a, b), 2)} h)`))),
    fact(`kgCO2e${label}`, formatNumber(r.kgco2e, 3)),
    fact("Start now", `${formatNumber(r.kgco2e_now, 3)} kgCO2e`),
    fact("Saving vs start now", h("strong", {}, `${formatNumber(r.saving_pct, 1)}%`), ` (${formatNumber(r.kgco2e_now - r.kgco2e, 3)} kgCO2e)`),
    fact("Energy", `${formatNumber(r.energy_kwh, 3)} kWh (${r.power_kw} kW × PUE ${r.pue})`),
  ];
  if (r.cost != null) facts.push(fact(`Cost (${r.price.currency || "currency"})`, `${formatNumber(r.cost, 2)} vs ${formatNumber(r.cost_now, 2)} now`));
  if (r.power_cap_kw != null) facts.push(fact("Site cap", `${r.power_cap_kw} kW${r.now_fits_cap ? "" : " (starting now would exceed it)"}`));
  document.getElementById("result-facts").replaceChildren(...facts);
  const notes = [...r.notes];
  for (const res of row.reservations) notes.push(`shares the site cap with schedule #${res.schedule} ${res.name}: ${res.kw} kW ${utc(res.start)} → ${utc(res.end)}`);
  for (const s of row.skipped) notes.push(`not used: ${s.provider}: ${s.reason}`);
  notes.push(`method: ${r.method}`);
  document.getElementById("result-notes").replaceChildren(...notes.map((n) => h("li", { class: "muted" }, n)));
  if (row.intensity_window) chart(row);
}

async function chart(row) {
  const r = row.result, w = row.intensity_window;
  // a step function: each value holds until the next time, the last one until the window's end
  const x = [...w.times, w.end], y = [...w.values, w.values[w.values.length - 1]];
  const band = (a, b, color, opacity, name) => ({ type: "rect", xref: "x", x0: a, x1: b, yref: "paper", y0: 0, y1: 1,
    fillcolor: color, opacity, line: { width: 0 }, layer: "below", name });
  const shapes = r.slots.map(([a, b]) => band(a, b, COLORS[2], 0.25, "chosen"));
  for (const res of row.reservations) shapes.push(band(res.start, res.end, COLORS[5], 0.15, "reserved"));
  const nowEnd = new Date(Date.parse(r.now) + r.duration_h * 3.6e6).toISOString();
  shapes.push({ type: "rect", xref: "x", x0: r.now, x1: nowEnd, yref: "paper", y0: 0, y1: 1,
                line: { color: COLORS[0], width: 1.5, dash: "dash" }, fillcolor: "rgba(0,0,0,0)", name: "start now" });
  const what = r.history_used_as_forecast ? "measured history used as a forecast" : r.intensity.kind;
  const layout = chartLayout({ xTitle: "time (UTC)", yTitle: w.unit, uirevision: `schedule-${row.id}`,
    title: { text: `${r.intensity.provider} ${r.intensity.zone}: ${what}`, font: { size: 13 } },
    margin: { l: 56, r: 16, t: 40, b: 40 }, shapes, xaxis: { title: { text: "time (UTC)" }, type: "date" } });
  const trace = { type: "scatter", mode: "lines", line: { shape: "hv", color: COLORS[1] }, name: `intensity (${what})`, x, y };
  const note = document.getElementById("result-chart-note");
  try {
    await loadPlotly();
  } catch (err) {
    note.textContent = `The chart could not be drawn: ${err.message}. Reload the page.`;
    return;
  }
  Plotly.react("schedule-chart", [trace], layout, PLOT_CONFIG);
  note.textContent =
    `Green bands: the chosen slot${r.slots.length > 1 ? "s" : ""}; dashed: starting now for the same ${formatNumber(r.duration_h, 2)} h`
    + (row.reservations.length ? "; grey: power already reserved by your team's schedules." : ".");
}

function listRow(row) {
  const r = row.result;
  const slots = r.slots.length > 1 ? ` (${r.slots.length} slots)` : "";
  const show = h("button", { type: "button", class: "link", onclick: () => openSchedule(row.id) }, "show");
  const remove = h("button", { type: "button", class: "link", onclick: () => removeRow(row.id) }, "delete");
  return h("tr", { dataset: { schedule: row.id } },
    h("td", { class: "num" }, row.id), h("td", {}, row.name), h("td", {}, row.zone), h("td", {}, intensityLabel(r)),
    h("td", {}, utc(r.now)), h("td", {}, `${utc(r.start)} → ${utc(r.end)}${slots}`),
    h("td", { class: "num" }, formatNumber(r.duration_h, 2)), h("td", { class: "num" }, row.request.power_kw),
    h("td", { class: "num" }, formatNumber(r.kgco2e, 3)), h("td", { class: "num" }, formatNumber(r.kgco2e_now, 3)),
    h("td", { class: "num" }, `${formatNumber(r.saving_pct, 1)}%`),
    h("td", {}, row.job ? h("a", { href: row.job.url, title: `${row.job.name} (${row.job.state})` }, `#${row.job.id} ${row.job.state}`) : ""),
    h("td", {}, show, " ", remove));
}

async function openSchedule(id) {
  const answer = await getJSON(`${page.api}${id}/`);
  if (!answer.ok) return showErrorLines(listErrors, failureLines(answer, "could not load the schedule"));
  showResult(answer.body);
  document.getElementById("schedule-result").scrollIntoView({ behavior: "smooth" });
}

async function removeRow(id) {
  const answer = await requestJSON("DELETE", `${page.api}${id}/`);
  if (!answer.ok) return showErrorLines(listErrors, failureLines(answer, "could not delete the schedule"));
  tbody.querySelector(`tr[data-schedule="${id}"]`)?.remove();
  emptyRow.hidden = tbody.querySelectorAll("tr[data-schedule]").length > 0;
}

// the server rendered the rows; the script gives them their formatted cells and buttons
tbody.querySelectorAll("tr[data-schedule]").forEach((tr) => tr.remove());
for (const row of page.schedules) tbody.insertBefore(listRow(row), emptyRow);

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const data = new FormData(form);
  const body = { interruptible: data.get("interruptible") === "on" };
  for (const key of ["duration_h", "power_kw", "deadline_h", "pue", "site_cap_kw"]) {
    const v = String(data.get(key) || "").trim();
    if (v !== "") body[key] = Number(v);
  }
  for (const key of ["team", "name", "zone"]) {
    const v = String(data.get(key) || "").trim();
    if (v !== "") body[key] = v;
  }
  const now = String(data.get("now") || "").trim();
  if (now) body.now = `${now}Z`;
  const file = data.get("forecast_file");
  if (file && file.size) body.forecast_csv = await file.text();
  const button = document.getElementById("schedule-submit");
  button.disabled = true;
  errors.replaceChildren();
  const answer = await postJSON(page.api, body);
  button.disabled = false;
  if (!answer.ok) return showErrorLines(errors, failureLines(answer, "could not schedule"));
  showResult(answer.body);
  tbody.insertBefore(listRow(answer.body), tbody.firstChild);
  emptyRow.hidden = true;
});
