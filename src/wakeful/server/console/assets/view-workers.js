// Workers: stopped (the incarnation recorded its graceful stop), else live or expired (by
// the age of the last heartbeat); incarnation, generation, the leases each holds, refreshed
// every few seconds. Above them the fleet's code versions (GET /v1/versions, issue 40): live
// workers, which one takes the new starts, and how many runs are pinned to each.

import { get } from "./api.js";
import { ago, badge, clear, h, table, time } from "./dom.js";

const REFRESH = 2000;
const LIVE_WITHIN = 30; // seconds: three heartbeats at the default claim ttl of 30 s
const SETTING = "wakeful.console.liveWithin";

export function workersView(main, { showError }) {
  const list = h("div", { id: "workers" });
  const versions = h("div", { id: "versions" });
  let within = Number(sessionStorage.getItem(SETTING)) || LIVE_WITHIN;
  const threshold = h("input", { type: "number", min: 1, max: 3600, id: "live-within", value: within });
  threshold.addEventListener("change", () => {
    within = Math.max(1, Number(threshold.value) || LIVE_WITHIN);
    sessionStorage.setItem(SETTING, String(within));
    load();
  });
  clear(
    main,
    h("h1", {}, "Workers"),
    h("h2", {}, "Versions"),
    h(
      "p",
      { class: "muted" },
      "The newest version (the last to arrive among those with a live worker) takes the new starts; the others finish the runs pinned to them. Move a version's runs with wakeful runs migrate --from V --to W.",
    ),
    versions,
    h("h2", {}, "Incarnations"),
    h(
      "p",
      { class: "muted" },
      "A worker is live while its last heartbeat is at most ",
      threshold,
      " s old (a worker beats every third of its lease ttl); a worker that stopped gracefully shows as stopped, a killed one as expired, a newer registration of the same id as a higher generation.",
    ),
    list,
  );
  let closed = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    try {
      const [workers, leased, fleet] = await Promise.all([
        get("/v1/workers"),
        get("/v1/dispatches", { status: "leased", limit: 1000 }),
        get("/v1/versions"),
      ]);
      if (closed) return;
      clear(versions, versionTable(fleet));
      const now = Date.now();
      const leases = new Map();
      for (const d of leased.dispatches) {
        if (!d.holder || (d.lease_until && new Date(d.lease_until).getTime() < now)) continue;
        if (!leases.has(d.holder)) leases.set(d.holder, []);
        leases.get(d.holder).push(d);
      }
      const rows = workers.workers.map((w) => {
        const age = (now - new Date(w.last_heartbeat).getTime()) / 1000;
        const state = w.stopped_at ? "stopped" : age <= within ? "live" : "expired";
        const held = leases.get(`${w.worker_id}.g${w.generation}`) || [];
        return h(
          "tr",
          { "data-worker": w.worker_id },
          h("td", {}, w.worker_id),
          h("td", w.stopped_at ? { title: `stopped ${w.stopped_at}` } : {}, badge(state)),
          h("td", {}, h("code", {}, w.incarnation_id)),
          h("td", { class: "num" }, w.generation),
          h("td", { class: "num", "data-leases": held.length }, held.length),
          h("td", {}, held.slice(0, 5).map((d) => h("a", { href: `#/threads/${encodeURIComponent(d.thread_id)}`, class: "chip" }, d.thread_id))),
          h("td", { title: w.last_heartbeat }, ago(w.last_heartbeat, now)),
          h("td", {}, time(w.registered_at)),
        );
      });
      clear(
        list,
        rows.length
          ? table(["worker", "state", "incarnation", "generation", "leases", "threads", "last heartbeat", "registered"], rows, { class: "list" })
          : h("p", { class: "muted" }, "No worker has registered."),
      );
    } catch (error) {
      if (!closed) showError(error);
    }
    if (!closed) timer = setTimeout(load, REFRESH);
  }

  load();
  return () => {
    closed = true;
    clearTimeout(timer);
  };
}

function versionTable(fleet) {
  if (!fleet.versions.length) return h("p", { class: "muted" }, "No worker has named a version.");
  const rows = fleet.versions.map((v) =>
    h(
      "tr",
      { "data-version": v.version },
      h("td", {}, h("code", {}, v.version)),
      h("td", {}, v.newest ? badge("newest") : v.live_workers ? badge("draining") : badge("gone")),
      h("td", { class: "num", "data-live": v.live_workers }, v.live_workers),
      h("td", { class: "num" }, v.workers),
      h("td", { class: "num", "data-pinned": v.pinned_runs }, fleet.bounded ? `${v.pinned_runs}+` : v.pinned_runs),
      h("td", {}, v.arrived_at ? time(v.arrived_at) : ""),
    ),
  );
  return table(["version", "starts", "live workers", "workers", "pinned runs", "arrived"], rows, { class: "list" });
}
