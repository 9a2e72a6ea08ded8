// A thread's history (time travel, docs/time-travel.md): its checkpoints newest first as a
// vertical list, the head and the head's line marked, abandoned branches dimmed, each
// branch's fork point noted; and per checkpoint "Replay from here", "Fork" and "Edit state".
// The API scopes every call: only an operator or the thread's own tenant gets this far.

import { enc, get, post } from "./api.js";
import { askDialog, badge, clear, confirmAction, h, time } from "./dom.js";

const PAGE = 50;

export function historyPanel(node, threadId, { showError, navigate, changed }) {
  const base = `/v1/threads/${enc(threadId)}`;
  let page = { entries: [], branches: [], next_before: null };
  let notice = null;

  async function refresh() {
    page = await get(`${base}/history`, { limit: PAGE });
    draw();
  }

  function say(text) {
    notice = text;
    draw();
  }

  function draw() {
    const forks = new Map(); // fork point -> branches made from it
    for (const b of page.branches) {
      if (!forks.has(b.fork_point)) forks.set(b.fork_point, []);
      forks.get(b.fork_point).push(b);
    }
    const rows = [];
    for (const e of page.entries) {
      for (const b of forks.get(e.checkpoint_id) || []) {
        rows.push(h("li", { class: "fork-note", "data-fork": b.number }, h("span", { class: "rail" }, "↳"), `branch ${b.number} continues from here; it left ${b.old_head ?? "—"} behind`));
      }
      rows.push(entryRow(e));
    }
    clear(
      node,
      h("p", { class: "muted" }, "● the head, │ on the head's line, ○ an abandoned branch (still readable). Going back from an earlier checkpoint makes a branch; nothing is deleted."),
      notice ? h("p", { class: "notice", id: "history-notice" }, notice) : null,
      rows.length ? h("ol", { class: "history", id: "history" }, rows) : h("p", { class: "muted" }, "No checkpoints."),
      page.next_before ? h("p", { class: "muted" }, `Newest ${PAGE} shown.`) : null,
    );
  }

  // What ran inside a subgraph node of the step (its path, its graph, its supersteps in
  // order), committed inside the parent's run: one line per subgraph node path.
  function nesting(subgraphs) {
    return Object.entries(subgraphs || {}).map(([path, sg]) =>
      h(
        "span",
        { class: "subgraph muted", "data-subgraph": path, title: "the subgraph's supersteps, in order" },
        `↳ ${path} (${sg.graph ?? "subgraph"}): ${(sg.steps || []).map((step) => step.join(", ")).join(" → ")}`,
      ),
    );
  }

  function entryRow(e) {
    const where = e.head ? "head" : e.current ? "current" : "abandoned";
    return h(
      "li",
      { class: `${where} ${e.current ? "current" : ""}`, "data-checkpoint": e.checkpoint_id, "data-branch": e.branch, "data-where": where },
      h("span", { class: "rail", title: where }, e.head ? "●" : e.current ? "│" : "○"),
      h("span", { class: "branch", title: "the branch it was committed on" }, `branch ${e.branch}`),
      e.head ? h("span", { class: "head-tag" }, "head") : null,
      h("span", { class: "nodes", title: "step, and the nodes that produced it" }, `${e.step ?? "?"} ${e.nodes.length ? e.nodes.join(", ") : e.source ?? ""}`),
      ...nesting(e.subgraphs),
      badge(e.status),
      h("span", { class: "muted" }, e.source ?? ""),
      h("span", { class: "muted", title: "messages as of it" }, e.messages === null ? "" : `${e.messages} msg`),
      h("span", { class: "cpid", title: `${e.checkpoint_id} (run ${e.run_id})` }, e.checkpoint_id),
      h("span", { class: "muted", title: e.created_at }, time(e.created_at)),
      h(
        "span",
        { class: "actions" },
        h("button", { class: "secondary", "data-action": "replay", onclick: () => replay(e) }, "Replay from here"),
        h("button", { class: "secondary", "data-action": "fork", onclick: () => fork(e) }, "Fork"),
        h("button", { class: "secondary", "data-action": "edit-state", onclick: () => editState(e) }, "Edit state"),
      ),
    );
  }

  async function act(work) {
    try {
      await work();
    } catch (error) {
      showError(error);
    }
  }

  const replay = (e) =>
    act(async () => {
      const question = e.head
        ? `Run on from the head ${e.checkpoint_id}?`
        : `Replay from ${e.checkpoint_id}? The thread branches there; the later checkpoints stay readable as an abandoned branch.`;
      if (!(await confirmAction(question, "Replay", "Go back"))) return;
      const detail = await get(`${base}/checkpoints/${enc(e.checkpoint_id)}`, { limit: 1 });
      const target = detail.metadata.target ?? detail.metadata.graph;
      if (!target) throw new Error(`checkpoint ${e.checkpoint_id} names no target to run`);
      const accepted = await post(`${base}/runs`, { target, input: null, from_checkpoint: e.checkpoint_id });
      say(`Replay queued: run ${accepted.run_id} from ${e.checkpoint_id}.`);
      changed();
    });

  const fork = (e) =>
    act(async () => {
      const answer = await askDialog({
        id: "fork-dialog",
        title: `Fork ${threadId} at ${e.checkpoint_id}`,
        note: "A new thread with this thread's state and messages as of the checkpoint (same tenant). This thread is only read.",
        fields: [{ name: "new_thread_id", label: "new thread id", value: `${threadId}-fork`, placeholder: "new thread id" }],
        action: "Fork",
        check: (v) => (/^[A-Za-z0-9][A-Za-z0-9._:@+=-]*$/.test(v.new_thread_id.trim()) ? null : "An id is letters, digits and . _ : @ + = - (starting with a letter or digit)."),
      });
      if (!answer) return;
      const made = await post(`${base}/fork`, { new_thread_id: answer.new_thread_id.trim(), checkpoint_id: e.checkpoint_id });
      navigate(`#/threads/${enc(made.thread_id)}`);
    });

  const editState = (e) =>
    act(async () => {
      const detail = await get(`${base}/checkpoints/${enc(e.checkpoint_id)}`, { limit: 1 });
      const before = detail.state && typeof detail.state === "object" ? detail.state : {};
      let values = null;
      const answer = await askDialog({
        id: "edit-state-dialog",
        title: `Edit the state at ${e.checkpoint_id}`,
        note: e.head
          ? "The fields you change are applied through the graph's reducers (a list with an append reducer gets your list appended), as one new checkpoint."
          : "The fields you change are applied through the graph's reducers as one new checkpoint; this is an earlier checkpoint, so the thread branches here.",
        fields: [
          { name: "state", label: "state (JSON)", value: JSON.stringify(before, null, 2), multiline: true, rows: 14 },
          { name: "as_node", label: "as node (optional: the next step routes as if this node returned the values)", value: e.nodes.length === 1 ? e.nodes[0] : "" },
        ],
        action: "Save state",
        check: (v) => {
          let edited;
          try {
            edited = JSON.parse(v.state);
          } catch (error) {
            return `The state is not JSON: ${error.message}`;
          }
          if (!edited || typeof edited !== "object" || Array.isArray(edited)) return "The state is a JSON object of fields.";
          values = Object.fromEntries(Object.entries(edited).filter(([k, v2]) => JSON.stringify(v2) !== JSON.stringify(before[k])));
          return Object.keys(values).length ? null : "Nothing changed: edit a field first.";
        },
      });
      if (!answer) return;
      const asNode = answer.as_node.trim();
      const made = await post(`${base}/state`, { values, as_node: asNode || null, checkpoint_id: e.checkpoint_id });
      say(`State saved: checkpoint ${made.entry.checkpoint_id} (${made.entry.status}${made.frontier.length ? `, next ${made.frontier.map((t) => t.node).join(", ")}` : ""}). Use "Replay from here" on it to run on.`);
      changed();
    });

  return { refresh };
}
