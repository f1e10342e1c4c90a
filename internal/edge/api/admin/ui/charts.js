// The dashboard's charts of the last 15 minutes, drawn on canvases by
// this file alone (no library): it reads /admin/v1/history once, then
// each second only the seconds after the last one it has (?since=), and
// redraws. What each chart drew is in window.iopCharts (its series, as
// [time, value] points, px(time, value), the point's place on its canvas,
// and its time axis: t0, t1 and the ticks), for people and tests to check
// against the hist. The time axis spans the seconds the edge has: from its
// start (or 15 minutes back) to the last second that is over, at least
// minSpan seconds; before the first history arrives, no axis is drawn.
"use strict";

const windowSeconds = 900, minSpan = 10;
const hist = { start: 0, through: 0, outcomes: [], reasons: [], seconds: new Map() };

const outcomeColors = {
  completed: "#3fb950", refused: "#d29922", upstream_error: "#f85149", client_gone: "#8a96a3",
  invalid_request: "#a371f7", write_failed: "#db61a2", error: "#ff7b72", edge_stopped: "#79c0ff", other: "#c9d1d9",
};
const palette = ["#2f81f7", "#3fb950", "#d29922", "#f85149", "#a371f7", "#39c5cf", "#db61a2", "#e3b341", "#8a96a3", "#79c0ff"];
const colorOf = (name, i) => outcomeColors[name] || palette[i % palette.length];

// Each chart: its canvas id, its y unit, and its series from the seconds
// (oldest first). A series' points are [time, value]; a second without a
// value (no request saw a first token, no sample) has no point.
const chartDefs = {
  requests: { unit: "requests/s", series: secs => hist.outcomes
    .filter(o => secs.some(s => s.requests[o]))
    .map((o, i) => ({ name: o, color: colorOf(o, i), points: secs.map(s => [s.time, s.requests[o] || 0]) })) },
  ttft: { unit: "ms", series: secs => [["p50", "#2f81f7"], ["p95", "#d29922"]].map(([q, color]) => ({
    name: q, color, points: secs.filter(s => s.time_to_first_token_ms).map(s => [s.time, s.time_to_first_token_ms[q]]) })) },
  tokens: { unit: "tokens/s", series: secs => [{ name: "output tokens", color: "#39c5cf",
    points: secs.map(s => [s.time, s.output_tokens]) }] },
  providers: { unit: "requests", series: secs => {
    const names = [];
    for (const s of secs) for (const p of s.providers || []) {
      const k = p.node_id + "/" + p.provider_id;
      if (!names.includes(k)) names.push(k);
    }
    return names.flatMap((k, i) => ["in_flight", "queued"].map(field => ({
      name: k + " " + field.replace("_", "-"), color: palette[i % palette.length], dash: field === "queued",
      points: secs.filter(s => s.providers).flatMap(s => {
        const p = s.providers.find(p => p.node_id + "/" + p.provider_id === k);
        return p ? [[s.time, p[field]]] : [];
      }) })));
  } },
  refusals: { unit: "refusals/s", series: secs => hist.reasons
    .filter(r => secs.some(s => s.refusals[r]))
    .map((r, i) => ({ name: r, color: palette[(i + 2) % palette.length], points: secs.map(s => [s.time, s.refusals[r] || 0]) })) },
};

window.iopCharts = { through: 0, charts: {} };

// niceStep is a round tick step (1, 2 or 5 times a power of ten) giving
// about n ticks up to max.
function niceStep(max, n) {
  const raw = max / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
}

// clockTime is t's clock time, with its seconds when withSeconds.
function clockTime(t, withSeconds) {
  return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit",
    second: withSeconds ? "2-digit" : undefined, hour12: false });
}

// timeAxis is the x axis of the charts: [t0, t1], the last second that
// is over and the first one shown (the edge's start, at most
// windowSeconds back, at least minSpan back), and about 5 ticks on round
// clock times; null before the first history.
function timeAxis() {
  if (!hist.through) return null;
  const t1 = hist.through;
  const t0 = Math.min(t1 - minSpan, Math.max(hist.start, t1 - windowSeconds + 1));
  const step = [1, 2, 5, 10, 15, 30, 60, 120, 180, 300].find(s => s >= (t1 - t0) / 5) || 300;
  const ticks = [];
  for (let t = t1 - (t1 % step); t >= t0; t -= step) ticks.push({ t, label: clockTime(t, step < 60) });
  return { t0, t1, ticks };
}

function drawChart(name) {
  const def = chartDefs[name], canvas = document.getElementById("chart-" + name);
  const secs = [...hist.seconds.values()];
  const series = def.series(secs);
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  const css = getComputedStyle(document.documentElement);
  const bg = css.getPropertyValue("--panel").trim(), dim = css.getPropertyValue("--dim").trim();
  ctx.fillStyle = bg;
  ctx.fillRect(0, 0, w, h);

  const axis = timeAxis();
  if (!axis) {
    ctx.fillStyle = dim;
    ctx.font = "12px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText("waiting for the edge's history", w / 2, h / 2);
    window.iopCharts.charts[name] = { unit: def.unit, series: [], axis: null };
    document.getElementById("legend-" + name).replaceChildren(el("span", { class: "meta" }, "nothing yet"));
    return;
  }
  const left = 48, right = 10, top = 18, bottom = 22;
  const { t0, t1 } = axis;
  let max = 0;
  for (const s of series) for (const [, v] of s.points) max = Math.max(max, v);
  const step = niceStep(max > 0 ? max : 1, 4);
  const ymax = Math.max(step, Math.ceil((max > 0 ? max : 1) / step) * step);
  const px = (t, v) => [left + (w - left - right) * (t - t0) / (t1 - t0), top + (h - top - bottom) * (1 - v / ymax)];

  // Axes: y ticks with the unit, x ticks on round clock times.
  ctx.font = "11px system-ui, sans-serif";
  ctx.lineWidth = 1;
  ctx.fillStyle = dim;
  ctx.strokeStyle = "#263040";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let v = 0; v <= ymax + step / 2; v += step) {
    const [, y] = px(t0, v);
    ctx.beginPath(); ctx.moveTo(left, Math.round(y) + 0.5); ctx.lineTo(w - right, Math.round(y) + 0.5); ctx.stroke();
    ctx.fillText(Number(v.toPrecision(6)).toString(), left - 6, y);
  }
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  ctx.fillText(def.unit, 4, 2);
  ctx.textAlign = "center";
  for (const { t, label } of axis.ticks) {
    const [x] = px(t, 0), half = ctx.measureText(label).width / 2;
    ctx.fillText(label, Math.min(Math.max(x, half + 2), w - half - 2), h - bottom + 6); // whole, inside the canvas
  }

  // Lines join points one second apart; then every point gets a dot, on
  // top of every line, so a lone second shows.
  const drawn = series.map(s => ({ name: s.name, color: s.color, dash: !!s.dash,
    points: s.points.filter(([t]) => t >= t0 && t <= t1) }));
  for (const s of drawn) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 1.5;
    ctx.setLineDash(s.dash ? [5, 3] : []);
    ctx.beginPath();
    s.points.forEach(([t, v], i) => {
      const [x, y] = px(t, v);
      if (i > 0 && t - s.points[i - 1][0] === 1) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    });
    ctx.stroke();
  }
  ctx.setLineDash([]);
  for (const s of drawn) {
    ctx.fillStyle = s.color;
    for (const [t, v] of s.points) {
      const [x, y] = px(t, v);
      ctx.beginPath(); ctx.arc(x, y, 2, 0, 2 * Math.PI); ctx.fill();
    }
  }
  window.iopCharts.charts[name] = { unit: def.unit, series: drawn, px, axis };

  const legend = document.getElementById("legend-" + name);
  legend.replaceChildren(...drawn.map(s => el("span", { class: "key" + (s.dash ? " dash" : "") },
    el("i", { style: "border-color:" + s.color + ";background:" + (s.dash ? "transparent" : s.color) }), s.name)));
  if (drawn.length === 0) legend.replaceChildren(el("span", { class: "meta" }, "nothing yet"));
}

function drawCharts() {
  for (const name of Object.keys(chartDefs)) drawChart(name);
  window.iopCharts.through = hist.through;
}

let historyLoading = false;
async function loadHistory() {
  if (historyLoading) return;
  historyLoading = true;
  try {
    const since = hist.through ? "?since=" + hist.through : "";
    const h = await getJSON("/admin/v1/history" + since);
    hist.start = h.start;
    hist.outcomes = h.outcomes;
    hist.reasons = h.reasons;
    for (const s of h.data) hist.seconds.set(s.time, s);
    hist.through = Math.max(hist.through, h.through);
    for (const t of hist.seconds.keys()) {
      if (t <= hist.through - windowSeconds) hist.seconds.delete(t);
    }
    drawCharts();
  } catch (err) {
    setConn("reconnecting", "history: " + err.message);
  } finally {
    historyLoading = false;
  }
}

drawCharts(); // "waiting" until the first history
loadHistory();
setInterval(loadHistory, 1000);
window.addEventListener("resize", drawCharts);
