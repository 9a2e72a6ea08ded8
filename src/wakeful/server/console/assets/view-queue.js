// Queue: dispatches by status with counts, attempts and last errors; quarantine, inspect,
// requeue and purge (each with a confirmation).

import { enc, get, post, remove } from "./api.js";
import { ago, badge, clear, confirmAction, h, json, short, table, time } from "./dom.js";
import { parseMetrics, total } from "./promtext.js";

const STATUSES = ["scheduled", "queued", "pending", "leased", "awaiting", "quarantined", "done"];
const REFRESH = 2000;

export function queueView(main, { showError }) {
  let status = sessionStorage.getItem("wakeful.console.queue") || "pending";
  let after = null;
  const counts = h("div", { class: "tabs", id: "queue-tabs" });
  const list = h("div", { id: "dispatches" });
  const detail = h("div", { id: "inspection" });
  clear(main, h("h1", {}, "Queue"), counts, list, detail);
  let closed = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    try {
      const [metrics, page] = await Promise.all([
        fetch("/metrics", { cache: "no-store", credentials: "omit" }).then((r) => r.text()),
        status === "quarantined" ? get("/v1/quarantine", { after, limit: 100 }) : get("/v1/dispatches", { status, after, limit: 100 }),
      ]);
      if (closed) return;
      const samples = parseMetrics(metrics);
      clear(
        counts,
        STATUSES.map((s) => {
          const n = total(samples, "wakeful_queue_depth", { status: s });
          const capped = total(samples, "wakeful_queue_depth_capped", { status: s });
          return h(
            "button",
            { class: s === status ? "tab active" : "tab", "data-status": s, onclick: () => select(s) },
            s,
            n === null ? null : h("span", { class: "count", "data-count": s }, `${n}${capped ? "+" : ""}`),
          );
        }),
      );
      drawList(page);
    } catch (error) {
      if (!closed) showError(error);
    }
    if (!closed) timer = setTimeout(load, REFRESH);
  }

  function select(s) {
    status = s;
    after = null;
    sessionStorage.setItem("wakeful.console.queue", s);
    clear(detail);
    load();
  }

  function drawList(page) {
    const rows = page.dispatches.map((d) =>
      h(
        "tr",
        { "data-dispatch": d.dispatch_id },
        h("td", {}, d.dispatch_id),
        h("td", {}, h("a", { href: `#/threads/${enc(d.thread_id)}` }, d.thread_id)),
        h("td", {}, d.kind),
        h("td", {}, badge(d.status), d.not_before ? h("span", { class: "muted not-before", title: d.not_before }, ` until ${time(d.not_before)}`) : null),
        h("td", { class: "num" }, `${d.attempts}/${d.max_attempts}`),
        h("td", {}, d.holder ?? ""),
        h("td", { class: "error-text", title: d.last_error ?? "" }, short(d.last_error ?? "", 80)),
        h("td", { title: d.created_at ?? "" }, ago(d.created_at)),
        h("td", { class: "actions" }, actions(d)),
      ),
    );
    const pager = h("div", { class: "pager" });
    if (after) pager.append(h("button", { class: "link", onclick: () => ((after = null), load()) }, "← first page"));
    if (page.next_after) pager.append(h("button", { class: "link", id: "next-page", onclick: () => ((after = page.next_after), load()) }, "next →"));
    clear(
      list,
      rows.length
        ? table(["dispatch", "thread", "kind", "status", "attempts", "holder", "last error", "created", ""], rows, { class: "list" })
        : h("p", { class: "muted" }, `No ${status} dispatches.`),
      pager,
    );
  }

  function actions(d) {
    const buttons = [];
    if (d.status === "quarantined") {
      buttons.push(h("button", { class: "secondary", "data-action": "inspect", onclick: () => inspect(d.dispatch_id) }, "Inspect"));
      buttons.push(h("button", { "data-action": "requeue", onclick: () => act(`Requeue ${d.dispatch_id} with a fresh retry budget?`, "Requeue", () => post(`/v1/quarantine/${enc(d.dispatch_id)}/requeue`)) }, "Requeue"));
      buttons.push(h("button", { class: "danger", "data-action": "purge", onclick: () => act(`Delete ${d.dispatch_id} for good?`, "Purge", () => remove(`/v1/quarantine/${enc(d.dispatch_id)}`)) }, "Purge"));
    } else if (d.exhausted && d.status !== "done") {
      buttons.push(h("button", { "data-action": "quarantine", onclick: () => act(`Quarantine ${d.dispatch_id}? It stays parked until requeued or purged.`, "Quarantine", () => post(`/v1/dispatches/${enc(d.dispatch_id)}/quarantine`)) }, "Quarantine"));
    }
    return buttons;
  }

  async function act(question, label, run) {
    if (!(await confirmAction(question, label))) return;
    try {
      await run();
      clear(detail);
      load();
    } catch (error) {
      showError(error);
    }
  }

  async function inspect(id) {
    try {
      const found = await get(`/v1/quarantine/${enc(id)}`);
      clear(detail, h("h2", {}, `Inspect ${id}`), h("div", { class: "columns" }, h("div", {}, h("h3", {}, "Dispatch"), json(found.dispatch)), h("div", {}, h("h3", {}, "Thread"), json(found.thread))));
    } catch (error) {
      showError(error);
    }
  }

  load();
  return () => {
    closed = true;
    clearTimeout(timer);
  };
}
