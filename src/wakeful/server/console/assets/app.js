// The console's shell: sign-in, navigation (hash routes), the error banner, and the views.

import { ApiError, call, session } from "./api.js";
import { clear, h } from "./dom.js";
import { threadsView } from "./view-threads.js";

// The first view's module is imported up front; the others when first opened.
const lazy = (file, name) => async (...args) => (await import(file))[name](...args);
const threadView = lazy("./view-thread.js", "threadView");
const queueView = lazy("./view-queue.js", "queueView");
const workersView = lazy("./view-workers.js", "workersView");
const overviewView = lazy("./view-overview.js", "overviewView");
const schedulesView = lazy("./view-schedules.js", "schedulesView");
const webhooksView = lazy("./view-webhooks.js", "webhooksView");
const limitsView = lazy("./view-limits.js", "limitsView");

const IDENTITY = "wakeful.console.identity";
const main = document.getElementById("main");
const banner = document.getElementById("banner");
let current = null; // the mounted view's cleanup

export function showError(error) {
  if (!error) {
    banner.hidden = true;
    return;
  }
  const text = error instanceof Error ? error.message : String(error);
  clear(banner, h("span", {}, text), h("button", { class: "link", onclick: () => showError(null) }, "dismiss"));
  banner.hidden = false;
}

const context = { showError, navigate: (hash) => (location.hash = hash) };

function signInView() {
  const input = h("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "off",
    placeholder: "bearer token",
    required: true,
  });
  const note = h("p", { class: "error", id: "signin-error" });
  const form = h(
    "form",
    { class: "signin", id: "signin" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Use a token of this server's token table (WAKEFUL_TOKENS). It is kept in this tab only."),
    input,
    h("button", { type: "submit" }, "Sign in"),
    note,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    note.textContent = "";
    try {
      await signIn(input.value.trim());
      route();
    } catch (error) {
      note.textContent = error.status === 401 ? "This token is not valid here." : error.message;
    }
  });
  clear(main, form);
  input.focus();
}

async function signIn(token) {
  const identity = await call("GET", "/v1/whoami", { token });
  session.token = token;
  session.identity = identity;
  sessionStorage.setItem(IDENTITY, JSON.stringify(identity));
  renderChrome();
  return identity;
}

// The identity of the token in this tab, remembered at sign-in so a reload shows the first
// view at once; it is checked again in the background (the token may have been revoked).
function remembered() {
  try {
    const identity = JSON.parse(sessionStorage.getItem(IDENTITY) || "null");
    return identity && typeof identity.operator === "boolean" ? identity : null;
  } catch {
    return null;
  }
}

function renderChrome() {
  const identity = session.identity;
  const nav = document.getElementById("nav");
  const who = document.getElementById("who");
  const out = document.getElementById("signout");
  nav.hidden = !identity;
  out.hidden = !identity || identity.development;
  for (const link of nav.querySelectorAll("[data-operator]")) link.hidden = !(identity && identity.operator);
  if (!identity) clear(who);
  else if (identity.development) clear(who, h("span", { class: "badge s-failed" }, "development mode"), " no tokens configured");
  else if (identity.operator) clear(who, h("span", { class: "badge s-operator", id: "role" }, "operator"));
  else clear(who, "tenant ", h("b", { id: "role" }, identity.tenant));
}

function signOut(message) {
  session.token = "";
  session.identity = null;
  sessionStorage.removeItem(IDENTITY);
  if (current) current();
  current = null;
  renderChrome();
  signInView();
  if (message) document.getElementById("signin-error").textContent = message;
}

session.onExpired = () => signOut("The server no longer accepts this token: sign in again.");

const ROUTES = [
  [/^#\/threads\/(.+)$/, (m) => threadView(main, decodeURIComponent(m[1]), context), false],
  [/^#\/queue$/, () => queueView(main, context), true],
  [/^#\/workers$/, () => workersView(main, context), true],
  [/^#\/overview$/, () => overviewView(main, context), true],
  [/^#\/schedules$/, () => schedulesView(main, context), false],
  [/^#\/webhooks$/, () => webhooksView(main, context), false],
  [/^#\/limits$/, () => limitsView(main, context), false],
  [/^#\/threads(\?.*)?$/, (m) => threadsView(main, new URLSearchParams((m[1] || "").slice(1)), context), false],
];

function route() {
  if (current) current();
  current = null;
  showError(null);
  if (!session.identity) return signInView();
  const hash = location.hash || "#/threads";
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", hash.startsWith(link.getAttribute("href")));
  }
  for (const [pattern, mount, operatorOnly] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    if (operatorOnly && !session.identity.operator) {
      clear(main, h("p", { class: "error", id: "forbidden" }, "This view is for operators."));
      return;
    }
    let cleanup = null;
    let left = false;
    current = () => {
      left = true;
      if (cleanup) cleanup();
    };
    Promise.resolve(mount(match)).then(
      (made) => {
        cleanup = made || null;
        if (left && cleanup) cleanup(); // navigated away while the module loaded
      },
      (error) => showError(error),
    );
    return;
  }
  location.hash = "#/threads";
}

async function start() {
  document.getElementById("signout").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", route);
  const known = session.token ? remembered() : null;
  if (known) {
    session.identity = known;
    renderChrome();
    route();
    signIn(session.token).catch((error) => {
      if (error instanceof ApiError && error.status === 401) signOut("The server no longer accepts this token: sign in again.");
      else showError(error);
    });
    return;
  }
  try {
    if (session.token) await signIn(session.token);
    else await signIn(""); // a server in development mode needs no token
  } catch (error) {
    session.token = "";
    if (!(error instanceof ApiError) || error.status !== 401) showError(error);
  }
  route();
}

start();
