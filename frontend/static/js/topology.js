// A cluster's drawing (workers.planner.topology.topology_drawing: boxes, edges and the first node's devices,
// with coordinates) as SVG: the cluster page and the cluster form's live preview draw it the same way.
const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text != null) node.textContent = text;
  return node;
}

export function drawTopology(container, drawing) {
  const pad = 4, w = drawing.width + 2 * pad, hgt = drawing.height + 2 * pad;
  const root = svg("svg", { id: "topology", viewBox: `${-pad} ${-pad} ${w} ${hgt}`, width: "100%", role: "img",
                            "aria-label": "the cluster's switches, nodes and links" });
  root.style.maxWidth = `${w}px`;
  for (const e of drawing.edges) {
    root.append(svg("line", { class: "link", x1: e.x1, y1: e.y1, x2: e.x2, y2: e.y2 }));
    if (e.label) root.append(svg("text", { class: "link-label", x: (e.x1 + e.x2) / 2 + 4, y: (e.y1 + e.y2) / 2 }, e.label));
  }
  for (const b of drawing.boxes) {
    const g = svg("g", { class: `box ${b.kind}`, "data-kind": b.kind });
    g.append(svg("rect", { x: b.x, y: b.y, width: b.w, height: b.h, rx: 5 }),
             svg("text", { class: "box-label", x: b.x + 6, y: b.y + 18 }, b.label),
             svg("text", { class: "box-detail", x: b.x + 6, y: b.y + 35 }, b.detail));
    root.append(g);
  }
  for (const d of drawing.devices) root.append(svg("rect", { class: "device", x: d.x, y: d.y, width: d.size, height: d.size, rx: 2 }));
  const notes = [];
  if (drawing.collapsed) notes.push("Identical switches and nodes are collapsed into “+N more”: the cluster is homogeneous, so the first of each level stands for the rest.");
  if (drawing.devices_more) notes.push(`The first node shows ${drawing.devices.length} of its devices.`);
  notes.push("Link labels: bandwidth per direction.");
  const caption = document.createElement("figcaption");
  caption.className = "muted small";
  caption.textContent = notes.join(" ");
  const figure = document.createElement("figure");
  figure.className = "topology";
  figure.append(root, caption);
  container.replaceChildren(figure);
}

const data = document.getElementById("topology-data");
if (data) drawTopology(document.getElementById("topology-drawing"), JSON.parse(data.textContent));
