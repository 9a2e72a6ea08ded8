// The API client of the console: the bearer token from the tab's session storage, sent as
// an Authorization header (never a cookie, never in a URL); problems become ApiError.

const KEY = "wakeful.console.token";

export class ApiError extends Error {
  constructor(status, problem) {
    const detail = (problem && (problem.detail || problem.title)) || `HTTP ${status}`;
    super(status ? `${status}: ${detail}` : detail);
    this.status = status;
    this.problem = problem || {};
  }
}

export const session = {
  get token() {
    return sessionStorage.getItem(KEY) || "";
  },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
  identity: null,
  onExpired: () => {},
};

export function headers(extra = {}) {
  const all = { Accept: "application/json", ...extra };
  if (session.token) all.Authorization = `Bearer ${session.token}`;
  return all;
}

export function query(params) {
  const kept = Object.entries(params || {}).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return kept.length ? `?${new URLSearchParams(kept)}` : "";
}

export async function call(method, path, { params, body, signal, token } = {}) {
  const extra = body === undefined ? {} : { "Content-Type": "application/json" };
  const all = headers(extra);
  if (token !== undefined) {
    if (token) all.Authorization = `Bearer ${token}`;
    else delete all.Authorization;
  }
  let response;
  try {
    response = await fetch(path + query(params), {
      method,
      headers: all,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      credentials: "omit",
      cache: "no-store",
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, { title: "the server cannot be reached (connection lost)" });
  }
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  const data = type.includes("json") ? await response.json() : await response.text();
  if (!response.ok) {
    const error = new ApiError(response.status, typeof data === "object" ? data : { detail: data });
    if (response.status === 401 && token === undefined && session.token) session.onExpired(error);
    throw error;
  }
  return data;
}

export const get = (path, params, signal) => call("GET", path, { params, signal });
export const post = (path, body, params) => call("POST", path, { body, params });
export const remove = (path) => call("DELETE", path);

export function enc(id) {
  return encodeURIComponent(id);
}
