// Schedules: the caller's schedules (an operator's: every tenant's) with their next tick
// and what they fired last; pause, resume, trigger and delete (each confirmed where it
// cannot be undone), refreshed every few seconds.

import { enc, get, post, remove } from "./api.js";
import { badge, clear, confirmAction, h, table, time } from "./dom.js";

const REFRESH = 3000;

function until(value, now) {
  const seconds = Math.round((new Date(value).getTime() - now) / 1000);
  if (seconds <= 0) return "due";
  if (seconds < 120) return `in ${seconds} s`;
  if (seconds < 7200) return `in ${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `in ${Math.round(seconds / 3600)} h`;
  return `in ${Math.round(seconds / 86400)} days`;
}

export function schedulesView(main, { showError }) {
  const list = h("div", { id: "schedules" });
  clear(
    main,
    h("h1", {}, "Schedules"),
    h("p", { class: "muted" }, "Every worker fires due ticks, each once per fleet; a tick's run is the dispatch sched:NAME:TICK. Create them with wakeful.schedule, PUT /v1/schedules/NAME or wakeful schedules create."),
    list,
  );
  let closed = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    try {
      const page = await get("/v1/schedules", { limit: 1000 });
      if (closed) return;
      const now = Date.now();
      const rows = page.schedules.map((s) =>
        h(
          "tr",
          { "data-schedule": s.name },
          h("td", {}, s.name),
          h("td", {}, s.cron ? `${s.cron} (${s.timezone})` : `every ${s.every} s`),
          h("td", {}, s.target),
          h("td", {}, s.thread ?? s.thread_template ?? ""),
          h("td", {}, s.paused ? badge("paused") : badge("active")),
          h("td", { title: s.next_fire_at ?? "", "data-next": s.next_fire_at ?? "" }, s.paused || !s.next_fire_at ? "" : `${time(s.next_fire_at)} (${until(s.next_fire_at, now)})`),
          h("td", { title: s.last_dispatch_id ?? "" }, lastFired(s)),
          h("td", { class: "num", "data-fired": s.fired }, s.fired),
          h("td", { class: "actions" }, actions(s)),
        ),
      );
      clear(
        list,
        rows.length
          ? table(["name", "when", "target", "thread", "state", "next tick", "last fired", "fired", ""], rows, { class: "list" })
          : h("p", { class: "muted" }, "No schedule."),
      );
    } catch (error) {
      if (!closed) showError(error);
    }
    if (!closed) timer = setTimeout(load, REFRESH);
  }

  function lastFired(s) {
    if (!s.last_dispatch_id) return "";
    const what = s.last_dispatch_id.includes(":trigger:") ? "run now" : time(s.last_tick);
    return s.thread ? h("a", { href: `#/threads/${enc(s.thread)}` }, what) : what;
  }

  function actions(s) {
    const path = `/v1/schedules/${enc(s.name)}`;
    return [
      s.paused
        ? h("button", { "data-action": "resume", onclick: () => act(() => post(`${path}/resume`)) }, "Resume")
        : h("button", { class: "secondary", "data-action": "pause", onclick: () => act(() => post(`${path}/pause`)) }, "Pause"),
      h("button", { "data-action": "trigger", onclick: () => act(() => post(`${path}/trigger`)) }, "Run now"),
      h("button", { class: "danger", "data-action": "delete", onclick: () => act(() => remove(path), `Delete schedule ${s.name}? The runs it fired stay.`) }, "Delete"),
    ];
  }

  async function act(run, question = null) {
    if (question && !(await confirmAction(question, "Delete"))) return;
    try {
      await run();
      load();
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
