// The cluster form (frontend/templates/clusters/cluster_form.html), on the shared document form
// (document_form.js): the device's peak as "dtype=TFLOP/s" pairs, the switch tiers as rows, and three
// starting points (a hardware profile, this machine, a pasted or uploaded document); the preview is the
// planner's totals and the drawing of the cluster page.
import { formatNumber, h } from "./common.js";
import { documentForm, documentToFields, fieldsToDocument, value } from "./document_form.js";
import { drawTopology } from "./topology.js";

const data = JSON.parse(document.getElementById("cluster-form-data").textContent);
const form = document.getElementById("cluster-form");
const tierRows = document.querySelector("#tier-rows tbody");
const NUMBERS = new Set(["num_nodes", "devices_per_node", "device.memory_GiB", "device.memory_bandwidth_GBps",
  "device.tdp_watts", "intra_node.bandwidth_GBps", "intra_node.latency_us", "inter_node.bandwidth_GBps", "inter_node.latency_us"]);
const isTier = (name) => name.startsWith("tiers[");

function parsePeak(text) {
  const out = {};
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const m = part.match(/^([\w.-]+)\s*[=:]\s*(.+)$/);
    if (!m) return text;  // not dtype=value pairs: sent as typed, the planner says what it must be
    out[m[1]] = value(m[2]);
  }
  return out;
}
const showPeak = (v) => (v && typeof v === "object" ? Object.entries(v).map(([k, x]) => `${k}=${x}`).join(", ") : v);

function addTier(tier = {}) {
  const i = tierRows.children.length;
  const cell = (key, v, mode) => h("td", {}, h("input", { name: `tiers[${i}].${key}`, value: v ?? "", inputmode: mode }),
                                   h("span", { class: "field-error", dataset: { for: `tiers[${i}].${key}` } }));
  const remove = h("button", { type: "button", class: "link", onclick: () => { row.remove(); renumber(); checker.check(); } }, "remove");
  const row = h("tr", {}, cell("name", tier.name), cell("nodes", tier.nodes, "numeric"),
                cell("oversubscription", tier.oversubscription ?? 1, "decimal"), h("td", {}, remove));
  tierRows.append(row);
}

function renumber() {
  [...tierRows.children].forEach((row, i) => {
    for (const el of row.querySelectorAll("[name]")) el.name = el.name.replace(/^tiers\[\d+\]/, `tiers[${i}]`);
    for (const el of row.querySelectorAll(".field-error")) el.dataset.for = el.dataset.for.replace(/^tiers\[\d+\]/, `tiers[${i}]`);
  });
}

function toDocument() {
  const doc = fieldsToDocument(form, { numbers: NUMBERS, skip: isTier, convert: { "device.peak_tflops": parsePeak } });
  doc.tiers = [...tierRows.children].map((row) => {
    const t = {};
    for (const el of row.querySelectorAll("input[name]")) {
      const key = el.name.split(".").at(-1);
      if (el.value.trim() !== "") t[key] = key === "name" ? el.value.trim() : value(el.value);
    }
    return t;
  });
  return doc;
}

function fill(doc) {
  documentToFields(form, doc, { skip: isTier, show: { "device.peak_tflops": showPeak } });
  tierRows.replaceChildren();
  for (const t of Array.isArray(doc.tiers) ? doc.tiers : []) addTier(t);
}

function onChecked({ figures, drawing }) {
  const peak = Object.entries(figures.peak_tflops).map(([k, v]) => `${formatNumber(v)} TFLOP/s ${k}`).join(" · ");
  document.getElementById("preview-figures").replaceChildren(
    h("div", {}, h("span", { class: "muted" }, "Devices "), h("strong", {}, String(figures.devices)), ` (${figures.nodes} × ${figures.devices_per_node})`),
    h("div", {}, h("span", { class: "muted" }, "Peak "), peak),
    h("div", {}, h("span", { class: "muted" }, "Memory "), `${formatNumber(figures.memory_GiB)} GiB`),
    h("div", {}, h("span", { class: "muted" }, "Bisection bandwidth "), h("strong", { id: "preview-bisection" }, formatNumber(figures.bisection_GBps)), " GB/s per direction"));
  drawTopology(document.getElementById("topology-drawing"), drawing);
}

const checker = documentForm({ form, kind: "clusters", id: data.id, teams: data.teams, toDocument, fill, onChecked });
document.getElementById("add-tier").addEventListener("click", () => { addTier(); checker.check(); });

const profiles = document.getElementById("start-profile");
for (const p of data.profiles) profiles.append(h("option", { value: p.name }, p.name));
profiles.addEventListener("change", () => {
  const p = data.profiles.find((x) => x.name === profiles.value);
  if (!p) return;
  const s = p.spec, set = (name, v) => { if (v != null) form.elements[name].value = v; };
  set("device.name", s.name || p.name);
  set("device.peak_tflops", showPeak(s.peak_tflops));
  set("device.memory_GiB", s.memory_GiB);
  set("device.memory_bandwidth_GBps", s.memory_bandwidth_GBps);
  set("device.tdp_watts", s.tdp_watts);
  set("devices_per_node", s.devices_per_node);
  set("intra_node.bandwidth_GBps", s.scale_up_GBps_per_direction);
  document.getElementById("start-note").textContent = `device figures from the profile ${p.name}`;
  checker.check();
});

document.getElementById("start-this-machine").addEventListener("click", () => {
  fill({ ...data.this_machine.document, name: form.elements.name.value || data.this_machine.document.name });
  document.getElementById("start-note").textContent = `this machine: ${data.this_machine.origin}`;
  checker.check();
});

fill(data.document);
if (Object.keys(data.document).length) checker.check();
form.dataset.ready = "1";  // filled: what the user types from here on is kept
