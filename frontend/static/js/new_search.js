// The new-search form (frontend/templates/planning/_new_search.html): a module of its own, as the Content-Security-Policy allows no inline script
import { failureLines, getJSON, postJSON } from "./common.js";
const form = document.getElementById("new-search");
// the shipped small example (workers/planner/data/examples): pick it in the selects, fill its training
document.getElementById("use-small-example").addEventListener("click", (ev) => {
  const b = ev.currentTarget, error = document.getElementById("new-search-error");
  const select = (name, value) => {
    const o = [...form.elements[name].options].find((opt) => opt.dataset.name === value);
    if (o) form.elements[name].value = o.value;
    return Boolean(o);
  };
  if (!select("cluster", b.dataset.cluster) || !select("model", b.dataset.model)) {
    error.textContent = `${b.dataset.model} or ${b.dataset.cluster} is not in your knowledge base: load the examples below first.`;
    return;
  }
  const t = JSON.parse(b.dataset.training);
  form.elements.global_batch_size.value = t.global_batch_size;
  form.elements.dtype.value = t.dtype;
  form.elements.optimizer.value = t.optimizer;
  error.textContent = "";
});
form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = new FormData(form);
  const strategy = {};
  for (const k of ["tp", "pp", "dp", "ep", "cp", "vpp", "micro_batch_size", "zero_stage"]) if (f.get(k)) strategy[k] = Number(f.get(k));
  if (f.get("recompute")) strategy.recompute = f.get("recompute");
  // empty = no limit beyond the device's memory; the planner checks the values (a 400 names the field)
  const constraints = {};
  for (const k of ["max_memory_GiB_per_device", "max_bubble_fraction"]) if (f.get(k)) constraints[k] = Number(f.get(k));
  const body = { cluster: Number(f.get("cluster")), model: Number(f.get("model")), top_k: Number(f.get("top_k") || 10),
                 training: { global_batch_size: Number(f.get("global_batch_size")), dtype: f.get("dtype"), optimizer: f.get("optimizer") },
                 strategy, objective: f.get("objective") || "throughput", constraints };
  const r = await postJSON("/api/searches/", body);
  if (r.status === 201) { location.href = `/planning/searches/${r.body.id}/`; return; }
  document.getElementById("new-search-error").textContent = failureLines(r, "the search was refused").join("; ");
});

// "Edit and run again" from a search that failed (/planning/?from=<id>): its request fills the form, to change
// what its message named and submit again (the stored search is left as it was)
async function prefill(id) {
  const error = document.getElementById("new-search-error");
  const r = await getJSON(`/api/searches/${id}/`);
  if (!r.ok) { error.textContent = `search ${id} is not among your teams' searches`; return; }
  const s = r.body, q = s.request || {};
  const set = (name, value) => { if (form.elements[name] && value != null) form.elements[name].value = String(value); };
  set("cluster", s.cluster);
  set("model", s.model_spec);
  const t = q.training || {};
  set("global_batch_size", t.global_batch_size); set("dtype", t.dtype); set("optimizer", t.optimizer);
  set("top_k", q.top_k); set("objective", q.objective);
  for (const [k, v] of Object.entries(q.constraints || {})) set(k, v);
  const fixed = Object.entries(q.strategy || {});
  for (const [k, v] of fixed) set(k, v);
  if (fixed.length) form.querySelector("details").open = true;
  form.dataset.from = String(id);
  const note = document.getElementById("new-search-from");
  const documents = s.cluster == null || s.model_spec == null
    ? " Its cluster or model was sent as a document, not one of your knowledge base: pick them above (or import them first)." : "";
  if (note) { note.hidden = false; note.textContent = `Filled in from search ${id}: change what its message names, then Search.${documents}`; }
  form.scrollIntoView();
}
const from = new URLSearchParams(location.search).get("from");
if (from && /^\d+$/.test(from)) prefill(Number(from));
