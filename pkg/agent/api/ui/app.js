// The flows page: polls GET /v1/flows (same origin: the agent's socket or
// its read-only HTTP listener) with the form's filters, shows the last
// flows and a service map of who talks to whom, by identity.
"use strict";

const LAST = 300;
const form = document.getElementById("filters");
const tbody = document.getElementById("flows");
const svg = document.getElementById("map");
const errEl = document.getElementById("error");
const statsEl = document.getElementById("stats");
const nodeEl = document.getElementById("node");
const pause = document.getElementById("pause");
document.getElementById("window").textContent = String(LAST);

function query() {
  const q = new URLSearchParams();
  for (const el of form.elements) {
    if (el.name && el.value.trim() !== "") q.set(el.name, el.value.trim());
  }
  q.set("last", String(LAST));
  return q;
}

// peerName is how a side of a flow is shown: namespace/pod, else the
// identity's telling labels, else the address.
function peerName(p) {
  if (p.pod) return (p.namespace ? p.namespace + "/" : "") + p.pod;
  const labels = p.labels || [];
  const reserved = labels.find((l) => l.startsWith("reserved:"));
  if (reserved) return reserved.slice("reserved:".length);
  const app = labels.find((l) => /^k8s:(app|name|k8s-app)=/.test(l));
  if (app) return (p.namespace ? p.namespace + "/" : "") + app.replace(/^k8s:/, "");
  return p.ip || "?";
}

// identityKey groups a side for the map: its identity (and a name).
function identityKey(p) {
  const id = p.identity || 0;
  let name;
  const labels = p.labels || [];
  const reserved = labels.find((l) => l.startsWith("reserved:"));
  if (reserved) name = reserved.slice("reserved:".length);
  else {
    const app = labels.find((l) => /^k8s:(app|name|k8s-app)=/.test(l));
    name = app ? (p.namespace ? p.namespace + "/" : "") + app.replace(/^k8s:/, "") : p.pod ? peerName(p) : p.ip || "?";
  }
  return { key: id ? "id:" + id : "ip:" + (p.ip || "?"), name: name, id: id, world: id === 2 || (!id && !p.pod) };
}

function cell(tr, text, title) {
  const td = document.createElement("td");
  td.textContent = text;
  if (title) td.title = title;
  tr.appendChild(td);
}

function renderTable(flows) {
  const rows = [];
  for (let i = flows.length - 1; i >= 0; i--) {
    const f = flows[i];
    const tr = document.createElement("tr");
    tr.className = f.verdict;
    tr.dataset.verdict = f.verdict;
    tr.dataset.source = peerName(f.source);
    tr.dataset.destination = peerName(f.destination);
    cell(tr, new Date(f.time).toLocaleTimeString());
    cell(tr, peerName(f.source) + (f.source.port ? ":" + f.source.port : ""), (f.source.labels || []).join(" "));
    cell(tr, peerName(f.destination) + (f.destination.port ? ":" + f.destination.port : ""), (f.destination.labels || []).join(" "));
    cell(tr, (f.protocol || "") + (f["tcp-flags"] ? " " + f["tcp-flags"].join(",") : ""));
    cell(tr, f.verdict + (f.direction ? " (" + f.direction + ")" : ""));
    const why = [f["drop-reason"], f["policy-match"], (f.policies || []).join(", ")].filter(Boolean).join("; ");
    cell(tr, why);
    let extra = "";
    if (f.service) extra = "svc " + (f["service-name"] || "") + " " + f.service;
    if (f.l7) extra += " HTTP " + (f.l7.method || "") + " " + (f.l7.path || "") + " " + (f.l7.code || "") + " " + f.l7.verdict;
    if (f.dns) extra += " DNS " + f.dns.query + " " + (f.dns.rcode || "") + " " + (f.dns.ips || []).join(",");
    cell(tr, extra.trim());
    rows.push(tr);
  }
  tbody.replaceChildren(...rows);
}

const NS = "http://www.w3.org/2000/svg";
function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderMap(flows) {
  const nodes = new Map();
  const edges = new Map();
  for (const f of flows) {
    if (f.type && f.type !== "l3-l4") continue;
    const s = identityKey(f.source), d = identityKey(f.destination);
    nodes.set(s.key, s);
    nodes.set(d.key, d);
    const k = s.key + ">" + d.key;
    const e = edges.get(k) || { from: s, to: d, ok: 0, drops: 0 };
    if (f.verdict === "dropped") e.drops++;
    else e.ok++;
    edges.set(k, e);
  }
  const list = [...nodes.values()].sort((a, b) => a.name.localeCompare(b.name));
  const pos = new Map();
  const cx = 320, cy = 210, r = list.length > 1 ? 160 : 0;
  list.forEach((n, i) => {
    const a = (2 * Math.PI * i) / list.length - Math.PI / 2;
    pos.set(n.key, { x: cx + r * Math.cos(a), y: cy + r * Math.sin(a) });
  });
  const defs = el("defs", {});
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "22", refY: "5", markerWidth: "6", markerHeight: "6", orient: "auto" });
  marker.appendChild(el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#555" }));
  defs.appendChild(marker);
  const children = [defs];
  for (const e of edges.values()) {
    const a = pos.get(e.from.key), b = pos.get(e.to.key);
    const g = el("g", { class: "edge" + (e.drops ? " drops" : ""), "data-from": e.from.name, "data-to": e.to.name,
      "data-forwarded": String(e.ok), "data-drops": String(e.drops) });
    g.appendChild(el("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y }));
    const label = e.ok + " ok" + (e.drops ? ", " + e.drops + " dropped" : "");
    g.appendChild(el("text", { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 - 4 }, label));
    children.push(g);
  }
  for (const n of list) {
    const p = pos.get(n.key);
    const g = el("g", { class: "node" + (n.world ? " world" : ""), "data-name": n.name, "data-identity": String(n.id) });
    g.appendChild(el("circle", { cx: p.x, cy: p.y, r: 14 }));
    g.appendChild(el("text", { x: p.x, y: p.y + 28 }, n.name + (n.id ? " (" + n.id + ")" : "")));
    children.push(g);
  }
  svg.replaceChildren(...children);
}

async function refresh() {
  if (pause.checked) return;
  try {
    const res = await fetch("/v1/flows?" + query().toString(), { headers: { Accept: "application/json" } });
    const body = await res.json();
    if (!res.ok) {
      errEl.textContent = body.message || res.statusText;
      return;
    }
    errEl.textContent = "";
    const flows = body.flows || [];
    const st = body.stats || {};
    statsEl.textContent = `${st.buffered || 0}/${st.capacity || 0} buffered, ${st.seen || 0} seen, lost: ` +
      `${st["rate-limited"] || 0} rate-limited, ${st["datapath-lost"] || 0} in the kernel ring`;
    if (flows.length && flows[0].node) nodeEl.textContent = "node " + flows[0].node;
    renderTable(flows);
    renderMap(flows);
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  } catch (e) {
    errEl.textContent = String(e);
  }
}

form.addEventListener("input", () => refresh());
form.addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
refresh();
setInterval(refresh, 1000);
