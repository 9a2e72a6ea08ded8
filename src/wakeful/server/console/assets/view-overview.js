// Overview: queue depth and throughput over the last minutes, sampled from /metrics (the
// Prometheus text format, whichever registry serves it) while the page is open.

import { clear, h, svg } from "./dom.js";
import { parseMetrics, total } from "./promtext.js";

const EVERY = 2000;
const WINDOW = 10 * 60 * 1000;
const MIN_SPAN = 60 * 1000;
const DEPTHS = ["pending", "leased", "awaiting", "quarantined"];
const COLORS = { pending: "#0b6bcb", leased: "#1a7f37", awaiting: "#9a6700", quarantined: "#c62828", submitted: "#6e40c9", settled: "#1a7f37" };
const history = []; // kept while the tab lives, so returning to the view shows the last minutes

export function overviewView(main, { showError }) {
  const figures = h("div", { class: "figures", id: "figures" });
  const depth = h("div", { class: "chart", id: "depth-chart" });
  const rate = h("div", { class: "chart", id: "rate-chart" });
  clear(
    main,
    h("h1", {}, "Overview"),
    figures,
    h("section", {}, h("h2", {}, "Queue depth"), depth),
    h("section", {}, h("h2", {}, "Throughput (per second)"), rate),
    h("p", { class: "muted" }, "Sampled from /metrics every 2 s while the console is open; the last 10 minutes."),
  );
  let closed = false;
  let timer = null;

  async function sample() {
    try {
      const text = await fetch("/metrics", { cache: "no-store", credentials: "omit" }).then((r) => {
        if (!r.ok) throw new Error(`/metrics answered ${r.status}`);
        return r.text();
      });
      const samples = parseMetrics(text);
      const point = { at: Date.now(), submitted: total(samples, "wakeful_submits_total") ?? 0, settled: total(samples, "wakeful_settles_total") };
      for (const s of DEPTHS) point[s] = total(samples, "wakeful_queue_depth", { status: s }) ?? 0;
      history.push(point);
      while (history.length && history[0].at < point.at - WINDOW) history.shift();
      if (!closed) draw();
    } catch (error) {
      if (!closed) showError(error);
    }
    if (!closed) timer = setTimeout(sample, EVERY);
  }

  function rates() {
    const out = [];
    for (let i = 1; i < history.length; i++) {
      const a = history[i - 1];
      const b = history[i];
      const dt = (b.at - a.at) / 1000;
      const backlog = (p) => p.pending + p.leased + p.awaiting;
      const submitted = Math.max(0, (b.submitted - a.submitted) / dt);
      // settled from the workers' counter when this server has it, else what left the queue
      const settled = b.settled !== null && a.settled !== null
        ? Math.max(0, (b.settled - a.settled) / dt)
        : Math.max(0, submitted - (backlog(b) - backlog(a)) / dt);
      out.push({ at: b.at, submitted, settled });
    }
    return out;
  }

  function draw() {
    const last = history.at(-1);
    const flow = rates();
    const now = flow.at(-1);
    clear(
      figures,
      DEPTHS.map((s) => h("div", { class: "figure", "data-figure": s }, h("b", {}, String(last[s])), h("span", {}, s))),
      h("div", { class: "figure", "data-figure": "throughput" }, h("b", {}, now ? now.settled.toFixed(1) : "…"), h("span", {}, "settled / s")),
    );
    clear(depth, chart(history, DEPTHS));
    clear(rate, chart(flow, ["submitted", "settled"]));
  }

  sample();
  return () => {
    closed = true;
    clearTimeout(timer);
  };
}

function chart(points, series) {
  const width = 720;
  const height = 160;
  const pad = 28;
  const end = Date.now();
  const first = points.length ? points[0].at : end;
  const start = Math.max(end - WINDOW, Math.min(first, end - MIN_SPAN)); // grows to 10 min
  const span = end - start;
  const top = Math.max(1, ...points.flatMap((p) => series.map((s) => p[s] || 0)));
  const x = (at) => pad + ((at - start) / span) * (width - pad - 4);
  const y = (v) => height - pad + 4 - (v / top) * (height - pad - 4);
  const lines = series.map((s) =>
    svg("polyline", {
      points: points.map((p) => `${x(p.at).toFixed(1)},${y(p[s] || 0).toFixed(1)}`).join(" "),
      fill: "none",
      stroke: COLORS[s],
      "stroke-width": 2,
      "data-series": s,
    }),
  );
  const axis = svg("g", { class: "axis" },
    svg("line", { x1: pad, y1: height - pad + 4, x2: width, y2: height - pad + 4 }),
    svg("text", { x: 2, y: 12 }, document.createTextNode(String(Math.round(top * 10) / 10))),
    svg("text", { x: pad, y: height - 6 }, document.createTextNode(`-${Math.round(span / 1000)} s`)),
    svg("text", { x: width - 30, y: height - 6 }, document.createTextNode("now")),
  );
  return [
    svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img" }, axis, ...lines),
    h("div", { class: "legend" }, series.map((s) => h("span", {}, h("i", { class: `c-${s}` }), s))),
  ];
}
