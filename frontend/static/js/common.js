// What every page script shares: JSON requests to the API (session cookie + CSRF token), a DRF error
// as lines a person can read, a small DOM builder, and the number formats of every page.

// ------------------------------------------------------------------------------------------ requests

export function csrfToken() {
  const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}

// -> {ok, status, body}; body is the parsed JSON answer, or null when there is none (or it is not JSON).
// A network failure is {ok: false, status: 0, body: null}: callers show it like any other failure.
export async function requestJSON(method, url, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") Object.assign(headers, { "Content-Type": "application/json", "X-CSRFToken": csrfToken() });
  let r;
  try {
    r = await fetch(url, { method, credentials: "same-origin", headers,
                           body: body === undefined ? undefined : JSON.stringify(body) });
  } catch {
    return { ok: false, status: 0, body: null };
  }
  const payload = await r.json().catch(() => null);
  return { ok: r.ok, status: r.status, body: payload };
}

export const getJSON = (url) => requestJSON("GET", url);
export const postJSON = (url, body = {}) => requestJSON("POST", url, body);

// ------------------------------------------------------------------------------------------ errors

// {field, message} of each message of a DRF error ({field: [messages]}, {detail}, nested dicts and lists
// flattened; field is the dotted path, "carbon_aware.deadline_h", or "" for the request as a whole)
export function errorEntries(body, field = "") {
  if (body == null) return [];
  if (typeof body === "string") return [{ field, message: body }];
  if (Array.isArray(body)) return body.flatMap((b) => errorEntries(b, field));
  return Object.entries(body).flatMap(([k, v]) => errorEntries(v, k === "non_field_errors" || k === "detail" ? field
    : field ? `${field}.${k}` : k));
}

// one entry as a line: "field: message", or the message alone when it names its field itself (the job API's
// energy settings say "energy.pue must be a number >= 1": not "energy: energy.pue must ...")
export function errorText({ field, message }) {
  return !field || message.startsWith(`${field} `) || message.startsWith(`${field}.`) ? message : `${field}: ${message}`;
}

// "field: message" lines of a DRF error
export function errorLines(body) {
  return errorEntries(body).map(errorText);
}

// The lines of a failed request's answer, or `fallback (HTTP status)` when it said nothing readable.
export function failureLines(response, fallback = "failed") {
  const lines = errorLines(response.body);
  return lines.length ? lines : [response.status ? `${fallback} (HTTP ${response.status})` : `${fallback} (no answer)`];
}

// Fill a list (<ul>) with one <li class="error"> per line.
export function showErrorLines(list, lines) {
  list.replaceChildren(...lines.map((line) => h("li", { class: "error" }, line)));
}

// --------------------------------------------------------------------------------------------- DOM

// h("td", {class: "num", dataset: {id: 3}, onclick: f}, "text", child, [more children])
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    // an object of CSSOM properties ({ width: "40%" }): a style="" attribute is refused by the
    // Content-Security-Policy (style-src 'self'), setting node.style is not
    else if (k === "style") Object.assign(node.style, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c != null && c !== false) node.append(c instanceof Node ? c : String(c));
  return node;
}

// ------------------------------------------------------------------------------------ number formats

// what a missing figure reads as, on every page
export const MISSING = "—";

const finite = (x) => x != null && x !== "" && Number.isFinite(Number(x));

// 12,345 / 0.123 (en-US grouping, exactly `digits` decimals)
export function formatNumber(x, digits = 0) {
  if (!finite(x)) return MISSING;
  return notNegativeZero(Number(x), digits).toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

// 0.123 -> "12.3%"; signed: "+12.3%" / "-4.0%"; what rounds to zero is "0.0%" ("+0.0%"), never "-0.0%"
export function formatPercent(x, digits = 1, { signed = false } = {}) {
  if (!finite(x)) return MISSING;
  const p = notNegativeZero(100 * Number(x), digits);
  return `${signed && p >= 0 ? "+" : ""}${p.toFixed(digits)}%`;
}

// x, or 0 when it rounds to zero at `digits` decimals (a tiny negative would print as "-0.0")
function notNegativeZero(x, digits) {
  return Math.abs(x) < 0.5 * 10 ** -digits ? 0 : x;
}

// Seconds as a person reads them, about four significant figures: "5.12 ms", "84.2 ms", "1.204 s",
// "12.34 s", "245 s".
export function formatSeconds(s) {
  if (!finite(s)) return MISSING;
  s = Number(s);
  if (s === 0) return "0 s";
  if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 2 : 1)} ms`;
  return `${s.toFixed(s < 10 ? 3 : s < 100 ? 2 : 0)} s`;
}

// measured / predicted and the like: "1.07×"
export function formatRatio(x, digits = 2) {
  return finite(x) ? `${Number(x).toFixed(digits)}×` : MISSING;
}

// How far a measurement is from its prediction, written one way on every page (plan, job, job list):
// measured / predicted to three significant figures, "1.07×", "82.4×", "0.0121×", "1,230×" (1× = as predicted).
export function formatVsPredicted(measured, predicted) {
  if (!finite(measured) || !finite(predicted) || Number(predicted) === 0) return MISSING;
  const r = Number(measured) / Number(predicted);
  return `${r.toLocaleString("en-US", { maximumSignificantDigits: 3 })}×`;
}

// The caveat stored with a prediction ("uncalibrated: run `cann-train calibrate`" when the planner used
// the shipped cpu placeholder: predicted.efficiency_profile.note), or "".
export function predictionCaveat(predicted) {
  return (predicted && predicted.efficiency_profile && predicted.efficiency_profile.note) || "";
}

// "512 B", "3.4 kB", "1.25 MB" (decimal units, as link bandwidths are quoted)
export function formatBytes(b) {
  if (!finite(b)) return MISSING;
  return b >= 1e6 ? `${(b / 1e6).toFixed(2)} MB` : b >= 1e3 ? `${(b / 1e3).toFixed(1)} kB` : `${b} B`;
}

// "60.0 GiB"
export function formatGiB(x, digits = 1) {
  return finite(x) ? `${formatNumber(x, digits)} GiB` : MISSING;
}
