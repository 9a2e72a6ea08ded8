// Webhooks: the most recent deliveries of the webhooks runs send when they end (issue 43):
// delivered ones, pending ones (failed attempts; the next one is due at the shown time) and
// dead ones (given up after a day, or refused), with the last error; refreshed every few
// seconds. A tenant sees the webhooks of its own runs.

import { get } from "./api.js";
import { ago, badge, clear, h, short, table, time } from "./dom.js";

const REFRESH = 3000;

export function webhooksView(main, { showError }) {
  const counts = h("p", { id: "webhook-counts", class: "muted" });
  const list = h("div", { id: "webhooks" });
  clear(
    main,
    h("h1", {}, "Webhooks"),
    h(
      "p",
      { class: "muted" },
      "Each run submitted with a webhook URL (or of a target registered with one) POSTs a signed body when it ends. Failed deliveries are retried with backoff for a day, then given up (dead).",
    ),
    counts,
    list,
  );
  let closed = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    try {
      const page = await get("/v1/webhooks", { limit: 100 });
      if (closed) return;
      const now = Date.now();
      const c = page.counts;
      clear(counts, `${c.pending} pending · ${c.delivered} delivered · ${c.dead} dead`);
      const rows = page.webhooks.map((w) =>
        h(
          "tr",
          { "data-webhook": w.webhook_id, "data-status": w.status },
          h("td", {}, h("code", {}, w.webhook_id)),
          h("td", {}, badge(w.status)),
          h("td", {}, w.event),
          h("td", {}, h("a", { href: `#/threads/${encodeURIComponent(w.thread_id)}` }, w.thread_id)),
          h("td", { class: "num", "data-attempts": w.attempts }, w.attempts),
          h("td", { class: "error-text", title: w.last_error || "" }, short(w.last_error || "", 90)),
          h("td", { title: w.next_attempt_at || "" }, w.next_attempt_at ? ago(w.next_attempt_at, now) : ""),
          h("td", { title: w.url }, short(w.url, 60)),
          h("td", {}, time(w.updated_at)),
        ),
      );
      clear(
        list,
        rows.length
          ? table(["webhook id", "status", "event", "thread", "attempts", "last error", "next attempt", "url", "updated"], rows, { class: "list" })
          : h("p", { class: "muted" }, "No webhook delivery has been attempted yet."),
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
