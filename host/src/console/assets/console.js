// dedup-host console: updates the overview's numbers and charts in place every few seconds
// from /api/overview, and a route page's charts from their fragment (#live-charts). Text goes
// in with textContent only; the charts are the server's own SVG (escaped where it renders
// them, as on the page), parsed inert and swapped in whole.
"use strict";

const EVERY_MS = 3000;
// The outcomes the tables sum in their "other" column (console/overview.rs, OTHER).
const OTHER = ["busy", "lost_claim", "coalesced"];

function polyline(series) {
  const max = Math.max(1, ...series);
  return series.map((v, i) => `${i},${(20 - (19 * v) / max).toFixed(1)}`).join(" ");
}

function value(route, group, key) {
  if (!route) return undefined;
  if (group === "outcomes") return route.outcomes[key] || 0;
  if (group === "hits") return Object.values(route.hits).reduce((a, b) => a + b, 0);
  if (group === "other") return OTHER.reduce((a, o) => a + (route.outcomes[o] || 0), 0);
  if (group === "gauge") return route[key] || 0;
  return undefined;
}

async function refresh() {
  let data;
  try {
    const response = await fetch("/api/overview", { credentials: "same-origin" });
    if (!response.ok) return;
    data = await response.json();
  } catch (e) {
    return;
  }
  for (const cell of document.querySelectorAll("[data-live]")) {
    const [route, group, key] = cell.dataset.live.split("|");
    const v = value(data.routes[route], group, key);
    if (v !== undefined) cell.textContent = String(v);
  }
  for (const chart of document.querySelectorAll("svg[data-series]")) {
    const [route, outcome] = chart.dataset.series.split("|");
    const r = data.routes[route];
    const series = r && r.series[outcome];
    const line = chart.querySelector("polyline");
    if (series && line) line.setAttribute("points", polyline(series));
  }
  const hosts = document.getElementById("host-count");
  if (hosts) hosts.textContent = String(data.hosts.filter((h) => !h.gone).length);
  document.body.dataset.refreshed = String(Date.now());
}

// A route page's charts, redrawn on the server: the fragment replaces the charts in place.
async function refreshCharts(box) {
  let text;
  try {
    const response = await fetch(box.dataset.src, { credentials: "same-origin" });
    if (!response.ok) return;
    text = await response.text();
  } catch (e) {
    return;
  }
  const parsed = new DOMParser().parseFromString(text, "text/html");
  const charts = parsed.body.querySelector("div.charts");
  if (!charts) return;
  box.replaceChildren(document.importNode(charts, true));
  document.body.dataset.chartsRefreshed = String(Date.now());
}

const liveCharts = document.getElementById("live-charts");
if (liveCharts && liveCharts.dataset.src) {
  setInterval(() => refreshCharts(liveCharts), EVERY_MS);
}

if (document.getElementById("routes")) {
  refresh();
  setInterval(refresh, EVERY_MS);
}
