// Parts of the thread view: the conversation, runs with their recoveries, submissions
// waiting for the thread, the timeline and checkpoints with a diff.

import { diff } from "./diff.js";
import { enc } from "./api.js";
import { ago, badge, clear, h, json, short, table, time } from "./dom.js";

// Recovery marks from durable events, per run. Data of another shape gives no mark (the
// timeline row shows the data as it is): events come from any producer, never trusted.
export function marksOf(event) {
  const data = event.data && typeof event.data === "object" && !Array.isArray(event.data) ? event.data : {};
  const list = (value) => (Array.isArray(value) ? value : []);
  if (event.type === "run.recovered") return [{ kind: "takeover", title: `taken over by ${data.holder ?? "?"}, ${data.reused ?? 0} results reused` }];
  if (event.type === "model.recovered") return list(data.plans).map((plan) => ({ kind: String(plan), title: "model stream recovery" }));
  if (event.type === "run.resumed") return [{ kind: "resumed", title: `answered ${list(data.answered).join(", ")}` }];
  if (event.type === "run.stalled") return [{ kind: "stalled", title: `idle ${data.idle_seconds ?? "?"} s` }];
  return [];
}

export function markChip(mark) {
  return h("span", { class: `mark m-${mark.kind.replace(/[^A-Za-z0-9]/g, "")}`, title: mark.title }, mark.kind);
}

// actions (optional): { edit(message), regenerate() }: "Edit" on each user message,
// "Regenerate" on the last answer (the API refuses them on a thread that is not an agent's).
export function renderMessages(node, messages, live, actions) {
  let lastAnswer = -1;
  messages.forEach((m, i) => {
    if (m.role === "assistant") lastAnswer = i;
  });
  const buttons = (m, i) => {
    if (!actions || live.size) return null;
    if (m.role === "user") return h("span", { class: "msg-actions" }, h("button", { class: "link", "data-action": "edit-message", onclick: () => actions.edit(m) }, "Edit"));
    if (i === lastAnswer) return h("span", { class: "msg-actions" }, h("button", { class: "link", "data-action": "regenerate", onclick: () => actions.regenerate() }, "Regenerate"));
    return null;
  };
  const items = messages.map((m, i) =>
    h(
      "div",
      { class: `msg r-${m.role}`, "data-message": m.id },
      buttons(m, i),
      h("div", { class: "who" }, m.role, m.metadata && m.metadata.edits ? h("span", { class: "muted", title: `edits ${m.metadata.edits}` }, " (edited)") : null, m.metadata && m.metadata.recoveries && m.metadata.recoveries.length ? m.metadata.recoveries.map((k) => markChip({ kind: k, title: "stream recovery" })) : null),
      h("div", { class: "text" }, contentText(m.content)),
      (m.tool_calls || []).map((c) => h("div", { class: "tool" }, `→ ${c.name || c.function?.name || "tool"}(${short(c.arguments ?? c.function?.arguments ?? "", 200)})`)),
    ),
  );
  const bubbles = [...live.values()].map((m) =>
    h(
      "div",
      { class: "msg r-assistant live", "data-live": m.message_id || "live" },
      h("div", { class: "who" }, "assistant ", h("span", { class: "pulse" }, "writing…")),
      h("div", { class: "text", id: "live-text" }, m.text),
      m.calls.map((c) => h("div", { class: "tool" }, `→ ${c.name || "tool"}(${c.arguments})`)),
    ),
  );
  clear(node, items.length || bubbles.length ? [items, bubbles] : h("p", { class: "muted" }, "No messages yet."));
}

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => (typeof part === "string" ? part : part.text ?? JSON.stringify(part))).join("");
  return JSON.stringify(content);
}

export function renderRuns(node, runs, marks, dispatches) {
  const rows = runs.map((r) => {
    const d = dispatches.get(r.run_id);
    const chips = [...(marks.get(r.run_id) || [])].map(markChip);
    if (d && d.attempts > 1) chips.unshift(markChip({ kind: `retries ${d.attempts - 1}`, title: d.last_error || "" }));
    return h(
      "tr",
      { "data-run": r.run_id },
      h("td", {}, r.run_id),
      h("td", {}, badge(r.status), r.wake_at ? h("span", { class: "muted wake-at", title: r.wake_at }, ` until ${time(r.wake_at)}`) : null),
      h("td", {}, r.graph ?? ""),
      h("td", { class: "marks" }, chips),
      h("td", { class: "num" }, d ? `${d.attempts}/${d.max_attempts}` : ""),
      h("td", { title: r.started_at ?? "" }, time(r.started_at)),
      h("td", { title: r.updated_at ?? "" }, ago(r.updated_at)),
    );
  });
  clear(node, rows.length ? table(["run", "outcome", "graph", "recoveries", "attempts", "started", "updated"], rows, { class: "list", id: "runs" }) : h("p", { class: "muted" }, "No runs."));
}

// The child runs this thread's runs spawned (ctx.spawn, an agent's delegate tool), each a
// link to its own thread, with its status and whether the suspended run waits on it (a join).
export function renderChildren(node, children, joins) {
  const awaited = new Set(joins.map((t) => t.question?.join?.thread));
  const rows = children.map((c) =>
    h(
      "tr",
      { "data-child": c.thread_id },
      h("td", {}, h("a", { href: `#/threads/${enc(c.thread_id)}` }, c.thread_id)),
      h("td", {}, c.target),
      h("td", {}, c.status ? badge(c.status) : h("span", { class: "muted" }, "not started")),
      h("td", {}, awaited.has(c.thread_id) ? "joined: the run waits for it" : ""),
      h("td", {}, c.detached ? "detached" : ""),
      h("td", {}, c.parent_run_id ?? ""),
      h("td", { title: c.spawned_at ?? "" }, time(c.spawned_at)),
    ),
  );
  clear(node, rows.length ? table(["thread", "target", "status", "join", "", "spawned by run", "spawned"], rows, { class: "list", id: "children" }) : h("p", { class: "muted" }, "No child runs."));
}

// Submissions that wait for the thread's run slot (status queued, behind whom), for a time
// (a delayed run, a sleeping run's wake-up: not_before) and those a coalesced run answered
// (busy threads, issue 36), from the thread's dispatches.
export function renderWaiting(node, dispatches) {
  const byId = new Map(dispatches.map((d) => [d.dispatch_id, d]));
  const runOf = (id) => byId.get(id)?.payload?.run_id || `run-${id}`;
  const coalesced = (d) => (Array.isArray(d.coalesced) ? d.coalesced : []);
  const rows = dispatches
    .filter((d) => d.status === "queued" || d.status === "scheduled" || d.not_before || d.answered_by || coalesced(d).length)
    .map((d) => {
      let what;
      if (d.status === "queued") what = `waits behind ${d.queued_behind ?? "the busy run"}`;
      else if (d.status === "scheduled") what = `scheduled: not before ${time(d.not_before ?? d.available_at)}`;
      else if (d.not_before) what = `not before ${time(d.not_before)}`;
      else if (d.answered_by) what = `coalesced: answered by ${runOf(d.answered_by)} (${d.answered_by})`;
      else what = `its run ${runOf(d.dispatch_id)} also answers ${coalesced(d).join(", ")}`;
      return h(
        "tr",
        { "data-dispatch": d.dispatch_id },
        h("td", {}, d.dispatch_id),
        h("td", {}, badge(d.status)),
        h("td", {}, d.if_busy ?? "enqueue"),
        h("td", { class: "waiting-what" }, what),
        h("td", { title: d.created_at ?? "" }, time(d.created_at)),
      );
    });
  clear(node, rows.length ? table(["submission", "status", "if busy", "", "submitted"], rows, { class: "list", id: "waiting" }) : h("p", { class: "muted" }, "Nothing waits for this thread."));
}

// A frame the timeline cannot interpret, shown as its raw JSON rather than dropped.
export function rawRow(name, data) {
  return h(
    "li",
    { class: "raw", "data-type": String(name), "data-raw": "" },
    h("span", { class: "etype" }, String(name)),
    h("code", { class: "raw-json" }, JSON.stringify(data) ?? String(data)),
  );
}

export function timelineRow(event) {
  const marks = marksOf(event);
  const data = event.data === null || event.data === undefined ? "" : short(event.data, 160);
  return h(
    "li",
    { class: marks.length ? "recovery" : event.type.startsWith("run.") ? "run" : "", "data-seq": event.seq, "data-type": event.type },
    h("span", { class: "seq" }, `#${event.seq}`),
    h("span", { class: "etype" }, event.type),
    marks.map(markChip),
    h("span", { class: "muted" }, event.run_id ?? ""),
    h("span", { class: "data" }, data),
    h("span", { class: "muted at" }, time(event.created_at)),
  );
}

// Checkpoints: pick A (and B) to see the state at A, or the diff from A to B.
export function renderCheckpoints(node, checkpoints, picked, onPick) {
  if (!checkpoints.length) {
    clear(node, h("p", { class: "muted" }, "No checkpoints."));
    return;
  }
  const byId = new Map(checkpoints.map((c) => [c.id, c]));
  const rows = checkpoints.map((c) =>
    h(
      "tr",
      { "data-checkpoint": c.id, class: picked.a === c.id || picked.b === c.id ? "picked" : "" },
      h("td", {}, h("input", { type: "radio", name: "cp-a", "aria-label": `state at ${c.id}`, checked: picked.a === c.id, onchange: () => onPick({ ...picked, a: c.id }) })),
      h("td", {}, h("input", { type: "radio", name: "cp-b", "aria-label": `diff to ${c.id}`, checked: picked.b === c.id, onchange: () => onPick({ ...picked, b: c.id }) })),
      h("td", {}, c.id),
      h("td", {}, c.run_id),
      h("td", {}, badge(c.status)),
      h("td", { title: c.committed_at }, time(c.committed_at)),
    ),
  );
  const a = byId.get(picked.a);
  const b = byId.get(picked.b);
  let detail;
  if (a && b && a.id !== b.id) {
    const changes = diff(a.state, b.state);
    detail = h(
      "div",
      { id: "checkpoint-diff" },
      h("h3", {}, `Diff ${a.id} → ${b.id}`),
      changes.length
        ? h("ul", { class: "diff" }, changes.map((c) => h("li", { class: `d-${c.kind}` }, h("code", {}, c.path), ` ${c.kind}: `, c.kind !== "added" ? h("del", {}, short(c.before, 300)) : null, c.kind === "changed" ? " → " : null, c.kind !== "removed" ? h("ins", {}, short(c.after, 300)) : null)))
        : h("p", { class: "muted" }, "The states are equal."),
    );
  } else if (a) {
    detail = h("div", { id: "checkpoint-state" }, h("h3", {}, `State at ${a.id}`), json(a.state));
  }
  clear(
    node,
    h("p", { class: "muted" }, "A: the state at a checkpoint. B: a second one to diff against A."),
    table(["A", "B", "checkpoint", "run", "status", "committed"], rows, { class: "list compact" }),
    detail,
  );
}
