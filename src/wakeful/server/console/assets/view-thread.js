// A thread: header and actions, open tickets, the conversation with the reply streaming
// live (edit a user message, regenerate the last answer), runs with their recoveries, the
// live event timeline, the history with its branches (time travel), checkpoints and diffs.

import { ApiError, enc, get, post } from "./api.js";
import { ago, askDialog, badge, clear, confirmAction, h, json, time } from "./dom.js";
import { follow } from "./sse.js";
import { marksOf, rawRow, renderCheckpoints, renderChildren, renderMessages, renderRuns, renderWaiting, timelineRow } from "./thread-parts.js";
import { historyPanel } from "./view-history.js";

const TIMELINE_BACKLOG = 200;
const TIMELINE_MAX = 500;
const MESSAGE_PAGES = 20;

export function threadView(main, threadId, { showError, navigate }) {
  const base = `/v1/threads/${enc(threadId)}`;
  const parts = {
    header: h("div", { class: "thread-head", id: "thread-head" }),
    tickets: h("div", { id: "tickets" }),
    conversation: h("div", { class: "conversation", id: "conversation" }),
    runs: h("div", { id: "runs-panel" }),
    children: h("div", { id: "children-panel" }),
    waiting: h("div", { id: "waiting-panel" }),
    timeline: h("ol", { class: "timeline", id: "timeline", reversed: true }),
    checkpoints: h("div", { id: "checkpoints" }),
    history: h("div", { id: "history-panel" }),
    link: h("span", { class: "link-state", id: "live-state" }, "connecting…"),
  };
  clear(
    main,
    parts.header,
    parts.tickets,
    h(
      "div",
      { class: "columns" },
      h("section", {}, h("h2", {}, "Conversation"), parts.conversation),
      h("section", {}, h("h2", {}, "Events ", parts.link), parts.timeline),
    ),
    h("section", {}, h("h2", {}, "Runs"), parts.runs),
    h("section", {}, h("h2", {}, "Child runs"), parts.children),
    h("section", {}, h("h2", {}, "Waiting submissions"), parts.waiting),
    h("section", {}, h("h2", {}, "History"), parts.history),
    h("section", {}, h("h2", {}, "Checkpoints"), parts.checkpoints),
  );

  const state = {
    thread: null,
    messages: [],
    live: new Map(),
    marks: new Map(),
    dispatches: new Map(),
    runs: [],
    checkpoints: [],
    picked: { a: null, b: null, byUser: false },
    seen: new Set(),
    answered: new Map(), // ticket id -> ticket, answered from this view; the notes outlive the ticket
    cancelled: false,
  };
  let closed = false;
  let stream = null;
  let timer = null;

  const history = historyPanel(parts.history, threadId, { showError, navigate, changed: () => soon() });
  const messageActions = { edit: editMessage, regenerate };

  function drawConversation() {
    renderMessages(parts.conversation, state.messages, state.live, messageActions);
  }

  async function editMessage(message) {
    try {
      const answer = await askDialog({
        id: "edit-message-dialog",
        title: "Edit this message and run on",
        note: "The thread branches before this message; the run answers the edited text. The previous answers stay readable in the history.",
        fields: [{ name: "content", label: "message", value: typeof message.content === "string" ? message.content : JSON.stringify(message.content), multiline: true, rows: 5 }],
        action: "Send edited",
        check: (v) => (v.content.trim() ? null : "The message is empty."),
      });
      if (!answer) return;
      await post(`${base}/messages/${enc(message.id)}/edit`, { content: answer.content });
      soon();
    } catch (error) {
      showError(error);
    }
  }

  async function regenerate() {
    try {
      if (!(await confirmAction("Answer the last user message again? The current answer stays readable on an abandoned branch.", "Regenerate", "Go back"))) return;
      await post(`${base}/regenerate`, {});
      soon();
    } catch (error) {
      showError(error);
    }
  }

  function drawHeader() {
    const t = state.thread;
    const claim = t.claim;
    const cancel = h("button", { class: "danger", id: "cancel-run", disabled: !["running", "suspended", "sleeping", null].includes(t.status) }, "Cancel run");
    cancel.addEventListener("click", async () => {
      if (!(await confirmAction(`Cancel the work of thread ${threadId}?`, "Cancel run", "Keep running"))) return;
      try {
        await post(`${base}/cancel`, { reason: "cancelled from the console" });
        state.cancelled = true;
        drawHeader();
      } catch (error) {
        showError(error);
      }
    });
    clear(
      parts.header,
      h("h1", {}, h("span", { class: "muted" }, "thread "), h("span", { id: "thread-id" }, threadId), " ", h("span", { id: "thread-status" }, badge(t.status)), t.wake_at ? h("span", { class: "muted", id: "wake-at" }, ` until ${time(t.wake_at)}`) : null),
      h(
        "dl",
        { class: "facts" },
        h("dt", {}, "tenant"), h("dd", {}, t.tenant ?? "—"),
        h("dt", {}, "graph"), h("dd", {}, t.graph ?? "—"),
        h("dt", {}, "run"), h("dd", {}, t.run_id ?? "—"),
        t.parent ? [h("dt", {}, "parent"), h("dd", { id: "parent-link" }, h("a", { href: `#/threads/${enc(t.parent.thread)}` }, t.parent.thread), ` (run ${t.parent.run_id})`)] : null,
        h("dt", {}, "version"), h("dd", {}, t.version),
        h("dt", {}, "claim"), h("dd", {}, claim ? `${claim.holder} (token ${claim.token}, expires ${ago(claim.expires_at)})` : "none"),
        h("dt", {}, "updated"), h("dd", { title: t.updated_at ?? "" }, time(t.updated_at)),
      ),
      cancel,
      state.cancelled ? h("p", { class: "notice", id: "cancel-sent" }, "Cancel requested: the run stops at its next commit.") : null,
    );
  }

  function drawTickets() {
    // a sleep's ticket is answered by its wake-up, a join's by its child's end: not by a person
    const open = (state.thread.tickets || []).filter((t) => !state.answered.has(t.id) && t.schema !== "wakeful.sleep" && t.schema !== "wakeful.join");
    // An answer's note stays after the run resumes and the ticket closes: a fast run would
    // otherwise erase the only confirmation the operator gets before they can read it.
    const answered = [...state.answered.values()];
    clear(
      parts.tickets,
      open.length ? [h("h2", {}, "Open tickets"), open.map(ticketForm)] : null,
      answered.length ? [h("h2", {}, "Answered here"), answered.map(answeredNote)] : null,
    );
  }

  function answeredNote(ticket) {
    return h("p", { class: "notice", "data-answered": ticket.id }, `Answered ${ticket.id}: the run continues.`);
  }

  function ticketForm(ticket) {
    const approval = ticket.question && typeof ticket.question === "object" && ticket.question.approval;
    const answer = h("textarea", { rows: 2, name: "answer", placeholder: "answer (JSON or text)" });
    const send = async (value) => {
      try {
        await post(`${base}/resume`, { answers: { [ticket.id]: value } });
        state.answered.set(ticket.id, ticket);
        drawTickets();
      } catch (error) {
        showError(error);
      }
    };
    const form = h(
      "form",
      { class: "card ticket", "data-ticket": ticket.id },
      h("div", {}, h("b", {}, ticket.id), ` (${ticket.node})`),
      approval
        ? h("p", {}, `Run tool ${approval.tool} with `, h("code", {}, JSON.stringify(approval.arguments)), "?")
        : json(ticket.question),
      approval
        ? [
            h("button", { type: "button", class: "approve", onclick: () => send("approve") }, "Approve"),
            h("button", { type: "button", class: "danger", onclick: () => send("deny") }, "Deny"),
          ]
        : [answer, h("button", { type: "submit", class: "approve" }, "Answer")],
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      let value = answer.value.trim();
      try {
        value = JSON.parse(value);
      } catch {
        // plain text is an answer too
      }
      send(value);
    });
    return form;
  }

  async function refresh() {
    try {
      const [thread, runs, dispatches, checkpoints, children] = await Promise.all([
        get(base),
        get(`${base}/runs`, { limit: 20 }),
        get("/v1/dispatches", { thread_id: threadId, limit: 200 }),
        get(`${base}/checkpoints`, { limit: 30 }),
        get(`${base}/children`),
      ]);
      const messages = await allMessages();
      if (closed) return;
      state.thread = thread;
      state.runs = runs.runs;
      state.dispatches = new Map(dispatches.dispatches.map((d) => [d.payload?.run_id || `run-${d.dispatch_id}`, d]));
      state.checkpoints = checkpoints.checkpoints;
      state.messages = messages;
      if (!state.picked.byUser || !state.checkpoints.some((c) => c.id === state.picked.a)) {
        state.picked = { a: state.checkpoints[0]?.id ?? null, b: null }; // follow the latest
      }
      drawHeader();
      drawTickets();
      drawConversation();
      renderRuns(parts.runs, state.runs, state.marks, state.dispatches);
      renderChildren(parts.children, children.children, (thread.tickets || []).filter((t) => t.schema === "wakeful.join"));
      renderWaiting(parts.waiting, dispatches.dispatches);
      renderCheckpoints(parts.checkpoints, state.checkpoints, state.picked, pick);
      if (thread.version > 0) await history.refresh();
    } catch (error) {
      if (!closed) showError(error);
    }
  }

  function pick(picked) {
    state.picked = { ...picked, byUser: true };
    renderCheckpoints(parts.checkpoints, state.checkpoints, state.picked, pick);
  }

  async function allMessages() {
    const out = [];
    for (let i = 0; i < MESSAGE_PAGES; i++) {
      const page = await get(`${base}/messages`, { after: out.length, limit: 100 });
      out.push(...page.messages);
      if (page.messages.length < 100) break;
    }
    return out;
  }

  function soon() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 150);
  }

  function onEvent(name, event) {
    const known = typeof event === "object" && event !== null && Number.isInteger(event.seq);
    if (known && state.seen.has(event.seq)) return;
    let row;
    try {
      if (!known || typeof event.type !== "string") throw new TypeError("not an event");
      row = timelineRow(event);
      for (const mark of marksOf(event)) {
        if (!state.marks.has(event.run_id)) state.marks.set(event.run_id, []);
        state.marks.get(event.run_id).push(mark);
      }
    } catch {
      // One odd frame must not end the stream (it would reconnect and drop the frame):
      // show it as it came.
      row = rawRow(name, event);
    }
    if (known) state.seen.add(event.seq);
    parts.timeline.prepend(row);
    while (parts.timeline.children.length > TIMELINE_MAX) parts.timeline.lastChild.remove();
    if (!known) return;
    if (/^run\.(completed|failed|cancelled|suspended|indeterminate|interrupted)$/.test(event.type)) {
      for (const [key, m] of state.live) if (m.run_id === event.run_id) state.live.delete(key);
    }
    soon();
  }

  function liveMessage(data) {
    const key = data.message_id || data.run_id || "live";
    if (!state.live.has(key)) state.live.set(key, { message_id: key, run_id: data.run_id, text: "", calls: [] });
    return state.live.get(key);
  }

  function onMessageFrame(kind, data) {
    if (kind === "complete") {
      state.live.delete(data.message_id);
      soon();
    } else if (kind === "delta") {
      const m = liveMessage(data);
      const offset = Number.isInteger(data.offset) ? data.offset : m.text.length;
      m.text = m.text.slice(0, offset) + data.text; // a resent or rewound part replaces what was there
    } else if (kind === "reset") {
      const m = liveMessage(data);
      m.text = m.text.slice(0, data.offset);
      m.calls = m.calls.slice(0, data.tool_calls);
    } else if (kind === "tool") {
      const m = liveMessage(data);
      const call = m.calls[data.index] || { name: data.name, arguments: "" };
      call.arguments = call.arguments.slice(0, data.offset) + data.arguments;
      m.calls[data.index] = call;
    }
    drawConversation();
  }

  function onFrame(frame) {
    if (frame.event === "error") {
      showError(new ApiError(frame.data?.status || 0, frame.data));
    } else if (frame.event.startsWith("messages/")) {
      try {
        onMessageFrame(frame.event.slice("messages/".length), frame.data);
      } catch {
        parts.timeline.prepend(rawRow(frame.event, frame.data)); // shown, not a reconnect
      }
    } else if (frame.event === "text.delta") {
      // fallback: a live text delta forwarded on the events stream
      const m = liveMessage({ run_id: frame.data?.run_id });
      m.text += frame.data?.data?.text ?? "";
      drawConversation();
    } else if (!["metadata", "end", "message"].includes(frame.event)) {
      onEvent(frame.event, frame.data);
    }
  }

  function onState(kind, why) {
    parts.link.textContent = kind === "live" ? "● live" : kind === "reconnecting" ? `reconnecting… (${why})` : `stopped (${why})`;
    parts.link.className = `link-state l-${kind}`;
  }

  function connect(after) {
    stream = follow(`${base}/stream?modes=events,messages&after=${after}`, {
      onFrame,
      onState,
      onRefused: (error) => {
        if (closed) return;
        if (error.status === 404 || error.status === 422) {
          // a server without the stream route (or its modes): durable events only
          parts.link.dataset.mode = "events";
          stream = follow(`${base}/events?after=${after}`, { onFrame, onState });
        } else showError(error);
      },
    });
  }

  (async () => {
    try {
      state.thread = await get(base);
    } catch (error) {
      clear(parts.header, h("h1", {}, `thread ${threadId}`));
      showError(error);
      return;
    }
    if (closed) return;
    drawHeader();
    const after = Math.max((state.thread.event_floor || 1) - 1, state.thread.last_seq - TIMELINE_BACKLOG, 0);
    connect(after);
    await refresh();
  })();

  return () => {
    closed = true;
    clearTimeout(timer);
    if (stream) stream.close();
  };
}
