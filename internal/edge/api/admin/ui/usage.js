// The dashboard's usage panel: tokens and GPU-seconds per key or per
// team over the last days, from GET /admin/v1/usage (the usage ledger),
// in this browser's time zone; a quota line under a row when GET
// /admin/v1/quotas answers with that key's or team's per-day limits (the
// panel works without it: 404 means no quotas). Re-read every 30 s and on
// a change of view. What it shows is in window.iopUsage (view, days,
// rows: {name, requests, total_tokens, gpu_seconds, daily: [{day,
// total_tokens, gpu_seconds}], quota}, quotas: "on", "none" or an error)
// for people and tests.
"use strict";

(() => {
  const days = 7, maxRows = 20, refresh = 30000;
  const tz = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  window.iopUsage = { view: "key", tz, days: [], rows: [], quotas: "", loaded: 0, error: "" };

  const url = path => location.origin + path; // never relative: see apiURL in app.js
  async function get(path) {
    const resp = await fetch(url(path), { cache: "no-store" });
    if (!resp.ok) throw Object.assign(new Error(path + ": " + resp.status), { status: resp.status });
    return resp.json();
  }
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }
  // The last `days` dates in tz, oldest first (YYYY-MM-DD: en-CA's form).
  function lastDays() {
    const fmt = new Intl.DateTimeFormat("en-CA", { timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit" });
    const out = [];
    for (let i = days - 1; i >= 0; i--) {
      const d = fmt.format(new Date(Date.now() - i * 86400e3));
      if (!out.includes(d)) out.push(d);
    }
    return out;
  }
  const qs = params => new URLSearchParams(params).toString();

  // quotaOf finds name's per-day limits in the quotas list
  // [{scope, name, quota}]; null when none.
  function quotaOf(quotas, scope, name) {
    if (!quotas) return null;
    const plural = scope + "s";
    let list = Array.isArray(quotas) ? quotas.filter(q => !q.scope || q.scope === scope || q.kind === scope) : quotas[plural];
    if (!list) return null;
    let entry = Array.isArray(list) ? list.find(q => q.name === name) : list[name];
    if (!entry) return null;
    const lim = entry.quota || entry.limits || entry;
    const lines = [];
    if (lim.tokens_per_day) lines.push({ what: "tokens", limit: lim.tokens_per_day });
    if (lim.gpu_seconds_per_day) lines.push({ what: "gpu_seconds", limit: lim.gpu_seconds_per_day });
    return lines.length ? lines : null;
  }

  let loading = false;
  async function load() {
    if (loading) return;
    loading = true;
    const view = window.iopUsage.view, dayList = lastDays(), from = dayList[0];
    try {
      const totals = await get("/admin/v1/usage?" + qs({ group_by: view, from, tz }));
      const rows = totals.data.slice().sort((a, b) => b.total_tokens - a.total_tokens || a.group.localeCompare(b.group)).slice(0, maxRows);
      const daily = await Promise.all(rows.map(r => get("/admin/v1/usage?" + qs({ [view]: r.group, group_by: "day", from, tz }))));
      let quotas = null, quotaState = "none";
      try {
        // GET /admin/v1/quotas: {object: "list", data: [{scope, name, quota}]}.
        const answer = await get("/admin/v1/quotas");
        quotas = Array.isArray(answer && answer.data) ? answer.data : answer;
        const limited = Array.isArray(quotas) && quotas.some(q => q.quota && (q.quota.tokens_per_day || q.quota.gpu_seconds_per_day));
        quotaState = limited ? "on" : "none";
      } catch (err) {
        quotaState = err.status === 404 ? "none" : err.message;
      }
      // key= and team= of "" select everything: the open API's key or the
      // keys in no team get their daily bars only when they are all there is.
      window.iopUsage = { ...window.iopUsage, days: dayList, quotas: quotaState, loaded: window.iopUsage.loaded + 1, error: "",
        rows: rows.map((r, i) => ({
          name: r.group, requests: r.requests, total_tokens: r.total_tokens, gpu_seconds: r.gpu_seconds,
          daily: dayList.map(day => {
            const d = (r.group === "" && rows.length > 1) ? null : daily[i].data.find(g => g.group === day);
            return { day, total_tokens: d ? d.total_tokens : 0, gpu_seconds: d ? d.gpu_seconds : 0 };
          }),
          quota: quotaOf(quotas, view, r.group),
        })) };
    } catch (err) {
      window.iopUsage.error = err.message;
    } finally {
      loading = false;
      render();
    }
  }

  const num = n => Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 });

  function bars(daily, field) {
    const max = Math.max(...daily.map(d => d[field]), 0);
    return el("div", { class: "usage-bars", title: daily.map(d => d.day + ": " + num(d[field])).join("\n") },
      ...daily.map(d => el("div", { "data-day": d.day, style: "height:" + (max > 0 ? Math.max(2, 100 * d[field] / max) : 0) + "%" })));
  }

  function render() {
    const u = window.iopUsage;
    document.getElementById("usage-head").textContent = (u.view === "team" ? "team" : "key");
    document.getElementById("usage-error").textContent = u.error ? "usage API: " + u.error : "";
    document.getElementById("usage-empty").hidden = u.rows.length > 0 || !!u.error;
    document.getElementById("usage-quotas").textContent = u.quotas === "on" ? "" :
      u.quotas === "none" ? "No quotas per day configured." : u.quotas ? "Quotas: " + u.quotas : "";
    document.getElementById("usage-tz").textContent = u.days.length ? u.days[0] + " – " + u.days[u.days.length - 1] + ", " + u.tz : "";
    document.querySelector("#usage tbody").replaceChildren(...u.rows.flatMap(r => {
      const today = r.daily[r.daily.length - 1] || { total_tokens: 0, gpu_seconds: 0 };
      const row = el("tr", { "data-usage": r.name },
        el("td", {}, r.name === "" ? (u.view === "team" ? "(no team)" : "(open API)") : r.name),
        el("td", { class: "n requests" }, num(r.requests)),
        el("td", { class: "n tokens" }, num(r.total_tokens)), el("td", {}, bars(r.daily, "total_tokens")),
        el("td", { class: "n gpu" }, num(r.gpu_seconds)), el("td", {}, bars(r.daily, "gpu_seconds")));
      if (!r.quota) return [row];
      return [row, el("tr", { class: "quota", "data-quota": r.name }, el("td", { colspan: 6 },
        ...r.quota.map(q => {
          const used = q.what === "tokens" ? today.total_tokens : today.gpu_seconds;
          const pct = Math.min(100, 100 * used / q.limit);
          return el("span", { class: "quota-line" + (pct >= 90 ? " near" : "") },
            (q.what === "tokens" ? "tokens" : "GPU-s") + " today " + num(used) + " / " + num(q.limit),
            el("span", { class: "bar" }, el("div", { style: "width:" + pct + "%" })));
        })))];
    }));
  }

  for (const b of document.querySelectorAll("#usage-view button")) {
    b.addEventListener("click", () => {
      window.iopUsage.view = b.dataset.view;
      for (const o of document.querySelectorAll("#usage-view button")) o.classList.toggle("on", o === b);
      load();
    });
  }
  load();
  setInterval(load, refresh);
})();
