// The "Submit a run" form. What the input box takes depends on the target (GET /v1/targets):
// an agent takes plain text (the user message, sent as it is typed); a graph takes JSON (an
// object of its state fields; the placeholder is built from its input schema). A target the
// server does not list (a server without a registry) takes JSON, else the text as it is.
// A choice says what the run does if the thread is busy (if_busy, default enqueue). "Start"
// delays the run: empty (now), a delay ("90s", "10m", "2h", "1d": the POST's after) or an
// instant with its offset ("2026-12-08T09:00Z": its at); the dispatch is stored at once.

import { enc, get, post } from "./api.js";
import { clear, h } from "./dom.js";

const IF_BUSY = [
  ["enqueue", "if busy: wait (enqueue)"],
  ["reject", "if busy: refuse (reject)"],
  ["interrupt", "if busy: stop it, run next (interrupt)"],
  ["rollback", "if busy: undo it, run next (rollback)"],
  ["coalesce", "if busy: merge with waiting (coalesce)"],
];

export function newRunForm(showError, navigate) {
  const thread = h("input", { name: "thread", id: "new-thread", placeholder: "thread id", required: true });
  const target = h("input", { name: "target", id: "new-target", placeholder: "target", required: true, list: "target-names", autocomplete: "off" });
  const names = h("datalist", { id: "target-names" });
  const input = h("textarea", { name: "input", id: "new-input", rows: 3 });
  const hint = h("p", { class: "muted", id: "input-hint" });
  // what the run does if the thread is busy (docs/busy-threads.md); the server's default first
  const ifBusy = h(
    "select",
    { name: "if_busy", id: "new-if-busy", "aria-label": "if the thread is busy", title: "If the thread is busy (a run is unfinished)" },
    IF_BUSY.map(([value, label]) => h("option", { value }, label)),
  );
  const start = h("input", { name: "start", id: "new-start", placeholder: "start: now, in 10m, or at 2026-12-08T09:00Z", title: "Empty: now. A delay (90s, 10m, 2h, 1d) or an instant with its offset." });
  const form = h(
    "form",
    { class: "card", id: "new-run" },
    h("h2", {}, "Submit a run"),
    h("div", { class: "toolbar" }, thread, target, names, ifBusy, start),
    input,
    hint,
    h("button", { type: "submit" }, "Submit run"),
  );
  let targets = new Map();

  function describe() {
    const known = targets.get(target.value.trim());
    input.dataset.kind = known ? known.kind : "unknown";
    if (known && known.kind === "agent") {
      input.placeholder = "Hello";
      hint.textContent = `Agent ${known.name}: plain text, the user message.`;
    } else if (known && known.kind === "graph") {
      input.placeholder = example(known.input_schema);
      hint.textContent = `Graph ${known.name}: JSON, an object of its state fields (empty: no input).`;
    } else {
      input.placeholder = "JSON, or plain text";
      hint.textContent = targets.size ? `Targets: ${[...targets.keys()].join(", ")}.` : "";
    }
  }

  target.addEventListener("input", describe);
  get("/v1/targets").then(
    (page) => {
      targets = new Map(page.targets.map((t) => [t.name, t]));
      clear(names, page.targets.map((t) => h("option", { value: t.name }, t.kind)));
      describe();
    },
    () => describe(), // an older server without the route: JSON, else text
  );
  describe();

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = target.value.trim();
    const value = inputValue(targets.get(name), input.value, showError);
    if (value === undefined) return;
    const when = startOf(start.value);
    if (when === undefined) {
      showError("Start is a delay (90s, 10m, 2h, 1d) or an instant with its offset (2026-12-08T09:00Z).");
      return;
    }
    try {
      const id = thread.value.trim();
      await post(`/v1/threads/${enc(id)}/runs`, { target: name, input: value, if_busy: ifBusy.value, ...when });
      navigate(`#/threads/${enc(id)}`);
    } catch (error) {
      showError(error);
    }
  });
  return form;
}

const UNITS = { s: 1, m: 60, h: 3600, d: 86400 };

// When the run starts, as the POST's fields: {} (now), {after: seconds} or {at: instant};
// undefined when the text is neither a delay nor an instant with its offset.
export function startOf(text) {
  const value = text.trim();
  if (!value) return {};
  const delay = /^(\d+(?:\.\d+)?)\s*([smhd]?)$/.exec(value);
  if (delay) return { after: Number(delay[1]) * UNITS[delay[2] || "s"] };
  if (/(Z|[+-]\d\d:?\d\d)$/i.test(value) && !Number.isNaN(Date.parse(value))) return { at: value };
  return undefined;
}

// The input to send, or undefined (after saying why) when there is none to send.
function inputValue(known, text, showError) {
  if (known && known.kind === "agent") {
    if (!text.trim()) {
      showError(`Write the message for agent ${known.name}.`);
      return undefined;
    }
    return text;
  }
  if (!text.trim()) return null;
  try {
    return JSON.parse(text);
  } catch (error) {
    if (known) {
      showError(`The input of graph ${known.name} is JSON: ${error.message}`);
      return undefined;
    }
    return text;
  }
}

// A placeholder from a graph's input schema: each field with an empty value of its type.
function example(schema) {
  const sample = {};
  for (const [name, field] of Object.entries((schema && schema.properties) || {})) sample[name] = emptyOf(field);
  return JSON.stringify(sample);
}

function emptyOf(field) {
  const type = Array.isArray(field.type) ? field.type[0] : field.type;
  if (type === "array") return [];
  if (type === "object") return {};
  if (type === "string") return "";
  if (type === "integer" || type === "number") return 0;
  if (type === "boolean") return false;
  return "…"; // any JSON value
}
