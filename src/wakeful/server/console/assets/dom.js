// Small DOM helpers. Every text goes through textContent (never innerHTML), so data from
// the API can never become markup.

export function h(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(node, kids);
  return node;
}

function append(node, kids) {
  for (const kid of kids) {
    if (kid === undefined || kid === null || kid === false) continue;
    if (Array.isArray(kid)) append(node, kid);
    else node.append(kid instanceof Node ? kid : String(kid));
  }
}

export function clear(node, ...kids) {
  node.replaceChildren();
  append(node, kids);
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs, ...kids) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const kid of kids) if (kid) node.append(kid);
  return node;
}

export function time(value) {
  if (!value) return "";
  const at = new Date(value);
  if (Number.isNaN(at.getTime())) return String(value);
  return at.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function ago(value, now = Date.now()) {
  if (!value) return "";
  const seconds = Math.round((now - new Date(value).getTime()) / 1000);
  if (seconds < 0) return `in ${-seconds} s`;
  if (seconds < 120) return `${seconds} s ago`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

export function badge(status) {
  const text = status || "new";
  return h("span", { class: `badge s-${text}` }, text);
}

export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

export function short(value, max = 120) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  if (text === undefined) return "";
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

export function table(headers, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", {}, name)))),
    h("tbody", {}, rows),
  );
}

// An in-page confirmation (a modal <dialog>): resolves true when the user confirms. Both
// buttons say what they do ("Keep running" / "Cancel run"), never a bare "Cancel" beside
// a cancelling action.
export function confirmAction(question, action = "Confirm", keep = "Go back") {
  return new Promise((resolve) => {
    const dialog = h(
      "dialog",
      { class: "confirm", "data-testid": "confirm" },
      h("p", {}, question),
      h(
        "form",
        { method: "dialog" },
        h("button", { value: "keep", class: "secondary", "data-testid": "confirm-keep" }, keep),
        h("button", { value: "ok", class: "danger", "data-testid": "confirm-ok" }, action),
      ),
    );
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "ok");
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

// An in-page form (a modal <dialog>) asking for a few values: resolves to an object of the
// fields' values when the user submits, or null when they go back. A check(values) that
// returns a message keeps the dialog open and shows it.
export function askDialog({ title, note, fields, action = "Save", keep = "Go back", check, id }) {
  return new Promise((resolve) => {
    const inputs = fields.map((f) =>
      f.multiline
        ? h("textarea", { name: f.name, rows: f.rows || 10, placeholder: f.placeholder, "aria-label": f.label }, f.value ?? "")
        : h("input", { name: f.name, value: f.value ?? "", placeholder: f.placeholder, "aria-label": f.label, autocomplete: "off" }),
    );
    const problem = h("p", { class: "error", "data-testid": "ask-error" });
    const ok = h("button", { value: "ok", class: "approve", "data-testid": "ask-ok" }, action);
    const form = h(
      "form",
      { method: "dialog" },
      fields.map((f, i) => h("label", { class: "field" }, h("span", {}, f.label), inputs[i])),
      problem,
      h("div", { class: "buttons" }, h("button", { value: "keep", class: "secondary", formnovalidate: true }, keep), ok),
    );
    const dialog = h("dialog", { class: "confirm ask", id, "data-testid": "ask" }, h("h3", {}, title), note ? h("p", { class: "muted" }, note) : null, form);
    const values = () => Object.fromEntries(fields.map((f, i) => [f.name, inputs[i].value]));
    form.addEventListener("input", () => (problem.textContent = "")); // the message was about the old text
    form.addEventListener("submit", (event) => {
      if (event.submitter !== ok) return;
      const message = check ? check(values()) : null;
      if (message) {
        event.preventDefault();
        problem.textContent = message;
      }
    });
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "ok" ? values() : null);
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}
