// The iop edge dashboard: reads the admin API once, then applies the
// lifecycle events of /admin/v1/events as they come, and reads the admin
// API again when a node connects or is fenced, when the stream reconnects
// (after a drop), and every 10 s as a safety net. Its charts are
// charts.js's.
"use strict";

const state = { nodes: [], providers: new Map(), queues: new Map(), refusals: [] };
const maxRefusals = 20;

function key(node, provider) { return node + "/" + provider; }

// apiURL is path on this page's origin. Never a URL relative to the
// page's: opened as http://user:KEY@edge/ui, the page's URL holds those
// credentials, and fetch refuses any URL that does ("Request cannot be
// constructed from a URL that includes credentials"). The origin holds
// none; the browser sends the Basic credentials it answered the edge's
// challenge for /ui with to the rest of the origin, so the admin routes
// and the events stream get them too.
function apiURL(path) { return location.origin + path; }

async function getJSON(path) {
  const resp = await fetch(apiURL(path), { cache: "no-store" });
  if (!resp.ok) throw new Error(path + ": " + resp.status);
  return resp.json();
}

let loading = null;
async function load() {
  if (loading) return loading;
  loading = (async () => {
    try {
      const [nodes, providers, queues] = await Promise.all(
        ["/admin/v1/nodes", "/admin/v1/providers", "/admin/v1/queues"].map(getJSON));
      state.nodes = nodes;
      state.providers = new Map(providers.map(p => [key(p.node_id, p.provider_id), p]));
      state.queues = new Map(queues.map(q => [q.model, q]));
      render();
    } catch (err) {
      setConn("reconnecting", "admin API: " + err.message);
    } finally {
      loading = null;
    }
  })();
  return loading;
}

function apply(ev) {
  switch (ev.type) {
    case "node_connected":
    case "node_draining":
    case "node_fenced":
      load();
      return;
    case "request_refused":
      state.refusals.unshift(ev);
      state.refusals.length = Math.min(state.refusals.length, maxRefusals);
      break;
    case "run_queued":
    case "run_admitted":
    case "run_started":
    case "run_ended": {
      const load_ = ev.load;
      if (!load_) break;
      if (ev.provider_id) {
        const p = state.providers.get(key(ev.node_id, ev.provider_id));
        if (p) {
          p.in_flight = load_.in_flight;
          p.capacity = load_.capacity;
          p.queued = load_.queued;
        }
      }
      if (ev.model) {
        const q = state.queues.get(ev.model);
        if (q) q.queued = load_.model_queued;
        else load(); // a model's first request: its queue is listed from now on
      }
      break;
    }
  }
  render();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function ago(iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.floor(s / 60) + "m ago";
  return Math.floor(s / 3600) + "h ago";
}

// providerState says whether p takes new requests, as iop status does:
// "healthy · available" only when it does, else why not. bad marks the
// card.
function providerState(p) {
  if (p.status === "orphan") return { text: "orphan · node gone", bad: true };
  const why = [];
  if (p.status === "draining") why.push("draining · no new requests");
  if (p.health !== "healthy") why.push("unhealthy");
  if (p.circuit === "open") why.push("circuit open · out of rotation");
  else if (p.circuit === "half_open") why.push("circuit half-open · on trial");
  if (p.status !== "available" && p.status !== "draining") why.push(p.status || "unknown");
  if (why.length === 0) return { text: "healthy · available", bad: false };
  return { text: why.join(" · "), bad: true };
}

// loadedLine says what p's server holds loaded, since when, and which
// of them keep_loaded keeps.
function loadedLine(p) {
  const loaded = p.loaded || [];
  if (loaded.length === 0) return el("div", { class: "loaded" }, "loaded: none");
  return el("div", { class: "loaded" }, "loaded: ", ...loaded.flatMap((m, i) => [
    i > 0 ? ", " : "",
    el("b", { "data-model": m.model }, m.model),
    el("span", { class: "meta" }, " " + (m.since ? ago(m.since) : "") + (m.kept ? " · kept" : "")),
  ]));
}

function render() {
  const nodes = document.querySelector("#nodes tbody");
  nodes.replaceChildren(...state.nodes.map(n => el("tr", { "data-node": n.id, class: n.draining ? "draining" : "" },
    el("td", {}, n.id, n.draining ? el("span", { class: "meta state" }, " draining") : ""),
    el("td", {}, n.label || "–"), el("td", {}, n.generation),
    el("td", {}, ago(n.connected_since)), el("td", {}, ago(n.last_heartbeat)), el("td", {}, n.version || "–"))));
  document.getElementById("node-count").textContent = "(" + state.nodes.length + ")";

  const providers = [...state.providers.values()];
  document.getElementById("providers").replaceChildren(...providers.map(p => {
    const pct = p.capacity > 0 ? Math.min(100, 100 * p.in_flight / p.capacity) : 0;
    const st = providerState(p);
    const cls = "provider" + (st.bad ? " out" : "") + (p.status === "orphan" ? " orphan" : "");
    return el("div", { class: cls, "data-provider": key(p.node_id, p.provider_id) },
      el("div", { class: "name" }, p.provider_id, " ", el("span", { class: "meta" }, "on " + p.node_id + " · " + (p.type || "?"))),
      el("div", { class: "meta" }, (p.models || []).join(", ")),
      ...(p.reads_loaded ? [loadedLine(p)] : []),
      el("div", { class: "bar" + (p.in_flight >= p.capacity ? " full" : "") }, el("div", { style: "width:" + pct + "%" })),
      el("div", { class: "numbers" },
        el("span", {}, "in flight ", el("b", { class: "in-flight" }, p.in_flight + " / " + p.capacity)),
        el("span", { class: "queued" + (p.queued > 0 ? " nonzero" : "") }, "queued ", p.queued)),
      el("div", { class: "meta state" }, st.text));
  }));
  document.getElementById("provider-count").textContent = "(" + providers.length + ")";
  document.getElementById("providers-empty").hidden = providers.length > 0;

  const queues = document.querySelector("#queues tbody");
  document.getElementById("queues-empty").hidden = state.queues.size > 0;
  queues.replaceChildren(...[...state.queues.values()].map(q => el("tr", { "data-queue": q.model },
    el("td", {}, q.model, ...(q.unmatched_targets && q.unmatched_targets.length ? [" ",
      el("span", { class: "unmatched", title: "no node serves these targets; check their spelling in the edge's models" },
        "unmatched: ", q.unmatched_targets.join(", "))] : [])),
    el("td", { class: "queued" + (q.queued > 0 ? " nonzero" : "") }, q.queued),
    el("td", {}, q.policy ? q.policy.max_queue : "–"),
    el("td", {}, q.policy ? (q.policy.queue_timeout_ms / 1000) + "s" : "–"))));

  document.getElementById("refusals").replaceChildren(...state.refusals.map(r => el("li", {},
    el("span", { class: "status" }, r.status), " ", r.reason, r.model ? " · " + r.model : "",
    " · ", new Date(r.time).toLocaleTimeString())));
  document.getElementById("refusals-empty").hidden = state.refusals.length > 0;
}

function setConn(cls, text) {
  const c = document.getElementById("conn");
  c.className = "conn " + cls;
  c.textContent = text;
}

function connect() {
  const es = new EventSource(apiURL("/admin/v1/events"));
  es.onopen = () => { setConn("live", "live"); load(); };
  es.onmessage = m => apply(JSON.parse(m.data));
  // The edge dropped this page for falling behind; EventSource reconnects
  // by itself and onopen reads the state again.
  es.addEventListener("dropped", () => setConn("reconnecting", "catching up…"));
  es.onerror = () => setConn("reconnecting", "reconnecting…");
}

load();
connect();
setInterval(load, 10000);
