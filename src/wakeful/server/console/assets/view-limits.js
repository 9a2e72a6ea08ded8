// Limits: the flow control the fleet shares (GET /v1/limits). Each rate-limit key's bucket:
// its rates, what it holds now of its capacity, a provider's block (a 429) and the runs
// waiting for it (a tenant sees its own); the concurrency keys' use when the store lists
// them. Refreshed every few seconds.

import { enc, get } from "./api.js";
import { badge, clear, h, table, time } from "./dom.js";

const REFRESH = 2000;

function amount(available, capacity, rate) {
  if (rate === null || rate === undefined) return "-";
  const shown = available === null || available === undefined ? "?" : available.toFixed(1);
  return `${shown} of ${capacity === null ? "?" : capacity.toFixed(capacity < 10 ? 1 : 0)} (${rate}/min)`;
}

function level(available, capacity) {
  if (available === null || capacity === null || capacity <= 0) return null;
  const share = Math.max(0, Math.min(1, available / capacity));
  return h("meter", { min: 0, max: 1, low: 0.1, optimum: 1, value: share.toFixed(3), title: `${Math.round(share * 100)} %` });
}

function until(value, now) {
  const seconds = (new Date(value).getTime() - now) / 1000;
  return seconds > 0 ? `for ${seconds.toFixed(1)} s` : "";
}

export function limitsView(main, { showError }) {
  const rates = h("div", { id: "rate-limits" });
  const keys = h("div", { id: "concurrency-keys" });
  clear(
    main,
    h("h1", {}, "Limits"),
    h("p", { class: "muted" }, "Rate limits are buckets in the store shared by every worker: each model call takes a request and its estimated tokens, and a provider's 429 blocks the key for the whole fleet until its reset (docs/flow-control.md)."),
    h("h2", {}, "Rate limits"),
    rates,
    h("h2", {}, "Concurrency keys"),
    keys,
  );
  let closed = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    try {
      const found = await get("/v1/limits");
      if (closed) return;
      const now = Date.now();
      const rows = found.rate_limits.map((b) =>
        h(
          "tr",
          { "data-key": b.key, "data-waiting": b.waiting.length },
          h("td", {}, h("code", {}, b.key)),
          h("td", {}, b.blocked_until && new Date(b.blocked_until).getTime() > now ? badge("blocked") : badge("open")),
          h("td", {}, level(b.requests_available, b.request_capacity), " ", amount(b.requests_available, b.request_capacity, b.requests_per_minute)),
          h("td", {}, level(b.tokens_available, b.token_capacity), " ", amount(b.tokens_available, b.token_capacity, b.tokens_per_minute)),
          h("td", { title: b.blocked_until ?? "", "data-blocked": b.blocked_until ?? "" }, b.blocked_until ? `${time(b.blocked_until)} ${until(b.blocked_until, now)}` : ""),
          h("td", { class: "num" }, b.waiting.length),
          h(
            "td",
            {},
            b.waiting.slice(0, 10).map((w) => h("a", { href: `#/threads/${enc(w.thread_id)}`, class: "chip", title: `${w.run_id}, waiting since ${w.since}` }, w.thread_id)),
          ),
        ),
      );
      clear(
        rates,
        rows.length
          ? table(["key", "state", "requests", "tokens", "blocked until", "waiting", "threads waiting"], rows, { class: "list" })
          : h("p", { class: "muted" }, "No rate-limit key has been used on this store."),
      );
      const held = (found.concurrency || []).map((c) =>
        h("tr", { "data-key": c.key ?? "" }, h("td", {}, h("code", {}, c.key ?? "")), h("td", {}, String(c.limit)), h("td", {}, String(c.admitted)), h("td", {}, String(c.waiting))),
      );
      clear(keys, held.length ? table(["key", "limit", "admitted", "waiting"], held, { class: "list" }) : h("p", { class: "muted" }, "No concurrency key is in use."));
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
