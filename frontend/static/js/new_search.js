// The new-search form (frontend/templates/planning/_new_search.html): a module of its own, as the Content-Security-Policy allows no inline script
import { failureLines, postJSON } from "./common.js";
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
