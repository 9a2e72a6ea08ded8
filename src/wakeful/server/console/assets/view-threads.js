// Threads: search by id prefix, filter by status and target, pages from the server.

import { enc, get } from "./api.js";
import { ago, badge, clear, h, table } from "./dom.js";
import { newRunForm } from "./submit-form.js";

const STATUSES = ["", "running", "suspended", "completed", "failed", "cancelled", "indeterminate", "interrupted"];
const PAGE = 50;

export function threadsView(main, params, { showError, navigate }) {
  const filters = {
    prefix: params.get("prefix") || "",
    status: params.get("status") || "",
    target: params.get("target") || "",
  };
  const trail = (params.get("trail") || "").split(",").filter(Boolean); // cursors of earlier pages
  const after = params.get("after") || "";

  const prefix = h("input", { name: "prefix", id: "search", placeholder: "thread id or prefix", value: filters.prefix });
  const status = h(
    "select",
    { name: "status", id: "status-filter" },
    STATUSES.map((s) => h("option", { value: s, selected: s === filters.status }, s || "any status")),
  );
  const target = h("input", { name: "target", id: "target-filter", placeholder: "target", value: filters.target });
  const search = h("form", { class: "toolbar", id: "thread-search" }, prefix, status, target, h("button", { type: "submit" }, "Search"));
  search.addEventListener("submit", (event) => {
    event.preventDefault();
    navigate(link({ prefix: prefix.value.trim(), status: status.value, target: target.value.trim() }));
  });

  const body = h("div", { id: "threads" }, h("p", { class: "muted" }, "Loading…"));
  clear(main, h("h1", {}, "Threads"), search, body, newRunForm(showError, navigate));

  let cancelled = false;
  (async () => {
    try {
      const page = await get("/v1/threads", { ...filters, after, limit: PAGE });
      if (cancelled) return;
      const rows = page.threads.map((t) =>
        h(
          "tr",
          { "data-thread": t.thread_id },
          h("td", {}, h("a", { href: `#/threads/${enc(t.thread_id)}` }, t.thread_id)),
          h("td", {}, badge(t.status)),
          h("td", {}, t.tenant ?? ""),
          h("td", { class: "num" }, t.version),
          h("td", { class: "num" }, t.message_count),
          h("td", { class: "num" }, t.last_seq),
          h("td", { title: t.updated_at }, ago(t.updated_at)),
        ),
      );
      const pager = h("div", { class: "pager" });
      if (after) {
        const back = trail.slice(0, -1);
        pager.append(h("a", { href: link(filters, trail.at(-1) || "", back), id: "prev-page" }, "← previous"));
      }
      if (page.next_after) {
        pager.append(h("a", { href: link(filters, page.next_after, [...trail, after]), id: "next-page" }, "next →"));
      }
      clear(
        body,
        rows.length
          ? table(["thread", "status", "tenant", "version", "messages", "events", "updated"], rows, { class: "list" })
          : h("p", { class: "muted", id: "no-threads" }, page.next_after ? "No match in this part of the list." : "No threads."),
        pager,
      );
      performance.mark("wakeful:threads-shown"); // the first view is on screen (benchmarks/console.py)
    } catch (error) {
      if (!cancelled) {
        clear(body);
        showError(error);
      }
    }
  })();
  return () => {
    cancelled = true;
  };
}

function link(filters, after = "", trail = []) {
  const kept = Object.entries({ ...filters, after, trail: trail.join(",") }).filter(([, v]) => v);
  return `#/threads${kept.length ? `?${new URLSearchParams(kept)}` : ""}`;
}
