// The dashboard's batch panel: the batches in progress, from GET
// /admin/v1/batches (oldest first), each with its lines done, failed and
// total, its rate (lines per second since it began running), the time
// the rest take at that rate (or why its lines wait, when its key's
// quota refuses them), and the edge running it. Re-read every 2 s.
// What it shows is in window.iopBatches (rows: the API's entries, loaded,
// error) for people and tests.
"use strict";

(() => {
  const refresh = 2000;
  window.iopBatches = { rows: [], loaded: 0, error: "" };

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }
  const num = n => Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 });
  function eta(seconds) {
    if (!(seconds > 0)) return "–";
    if (seconds < 90) return Math.round(seconds) + " s";
    if (seconds < 5400) return Math.round(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  // waiting says why a batch's lines do not run, and until when, in
  // place of an ETA its rate would get wrong.
  function waiting(r) {
    let s = "waiting: " + r.waiting;
    if (r.waiting_until > 0) s += " until " + new Date(r.waiting_until * 1000).toLocaleTimeString();
    return s;
  }

  let loading = false;
  async function load() {
    if (loading) return;
    loading = true;
    try {
      const resp = await fetch(location.origin + "/admin/v1/batches", { cache: "no-store" }); // never relative: see apiURL in app.js
      if (!resp.ok) throw new Error("/admin/v1/batches: " + resp.status);
      const rows = await resp.json();
      window.iopBatches = { rows: Array.isArray(rows) ? rows : [], loaded: window.iopBatches.loaded + 1, error: "" };
    } catch (err) {
      window.iopBatches.error = err.message;
    } finally {
      loading = false;
      render();
    }
  }

  function render() {
    const b = window.iopBatches;
    document.getElementById("batch-count").textContent = b.rows.length || "";
    document.getElementById("batches-empty").hidden = b.rows.length > 0 || !!b.error;
    document.getElementById("batches-error").textContent = b.error ? "batches API: " + b.error : "";
    document.querySelector("#batches tbody").replaceChildren(...b.rows.map(r => {
      const finished = r.done + r.failed;
      const pct = r.total > 0 ? 100 * finished / r.total : 0;
      return el("tr", { "data-batch": r.id },
        el("td", { title: r.owner ? "key " + r.owner : "open API" }, r.id),
        el("td", {}, r.api), el("td", { class: "status" }, r.status),
        el("td", { class: "progress" }, el("div", { class: "bar" }, el("div", { style: "width:" + pct + "%" })),
          el("span", { class: "lines" }, num(r.done) + " done" + (r.failed ? ", " + num(r.failed) + " failed" : "") + " of " + num(r.total))),
        el("td", { class: "n rate" }, r.lines_per_second > 0 ? num(r.lines_per_second) + "/s" : "–"),
        el("td", { class: "n eta" }, r.waiting ? waiting(r) : eta(r.eta_seconds)),
        el("td", { class: "runner" }, r.runner ? r.runner.split("/")[0] : "–"));
    }));
  }

  load();
  setInterval(load, refresh);
})();
