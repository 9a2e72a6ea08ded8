"""``GET /docs``: a self-contained page that renders ``/openapi.json`` (every route with its
parameters, body and responses). It loads nothing from another host, so it works offline and
on networks that block CDNs; FastAPI's default page fetches Swagger UI from a CDN and is
blank offline (see docs/http-api.md)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>wakeful HTTP API</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:62rem;padding:1rem 1.5rem}
h1{margin:.2rem 0}h2{margin-top:2rem;border-bottom:1px solid #d6dbe3;padding-bottom:.2rem}
details{border:1px solid #d6dbe3;border-radius:6px;margin:.45rem 0;padding:.3rem .7rem}
summary{cursor:pointer;font-family:ui-monospace,monospace}
.m{display:inline-block;min-width:4.2rem;font-weight:700;text-transform:uppercase}
.get{color:#0b6bcb}.post{color:#1a7f37}.delete{color:#c62828}.put,.patch{color:#9a6700}
table{border-collapse:collapse;margin:.3rem 0}td,th{border:1px solid #e3e7ee;padding:.2rem .5rem;
text-align:left;vertical-align:top}pre{background:#f5f7fa;padding:.5rem;overflow:auto}
.desc{white-space:pre-wrap}
</style></head><body>
<h1 id="title">wakeful HTTP API</h1>
<p>The machine-readable document: <a href="/openapi.json">/openapi.json</a>.</p>
<div id="intro" class="desc"></div><div id="routes">Loading /openapi.json ...</div>
<script>
"use strict";
function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const kid of kids) node.append(kid instanceof Node ? kid : String(kid ?? ""));
  return node;
}
function schemaName(s) {
  if (!s) return "";
  if (s.$ref) return s.$ref.split("/").pop();
  if (s.type === "array") return schemaName(s.items) + "[]";
  if (s.anyOf) return s.anyOf.map(schemaName).join(" | ");
  return s.type || "object";
}
function operation(path, method, op) {
  const body = el("div", {});
  if (op.description) body.append(el("p", {class: "desc"}, op.description));
  const params = op.parameters || [];
  if (params.length) {
    const t = el("table", {}, el("tr", {}, el("th", {}, "parameter"), el("th", {}, "in"),
      el("th", {}, "type"), el("th", {}, "required"), el("th", {}, "description")));
    for (const p of params) t.append(el("tr", {}, el("td", {}, p.name), el("td", {}, p.in),
      el("td", {}, schemaName(p.schema)), el("td", {}, p.required ? "yes" : ""),
      el("td", {}, p.description || (p.schema && p.schema.description) || "")));
    body.append(t);
  }
  const rb = op.requestBody && op.requestBody.content;
  if (rb) for (const [type, c] of Object.entries(rb))
    body.append(el("p", {}, "Body (" + type + "): ", el("code", {}, schemaName(c.schema))));
  const r = el("table", {}, el("tr", {}, el("th", {}, "status"), el("th", {}, "meaning"),
    el("th", {}, "body")));
  for (const [code, resp] of Object.entries(op.responses || {})) {
    const content = resp.content ? Object.entries(resp.content)
      .map(([t, c]) => t + " " + schemaName(c.schema)).join(", ") : "";
    r.append(el("tr", {}, el("td", {}, code), el("td", {}, resp.description || ""),
      el("td", {}, content)));
  }
  body.append(r);
  return el("details", {}, el("summary", {}, el("span", {class: "m " + method}, method), " ",
    path, "  ", el("span", {}, op.summary || "")), body);
}
fetch("/openapi.json").then(r => r.json()).then(spec => {
  document.getElementById("title").textContent = spec.info.title + " " + spec.info.version;
  document.getElementById("intro").textContent = spec.info.description || "";
  const groups = {};
  for (const [path, item] of Object.entries(spec.paths))
    for (const [method, op] of Object.entries(item)) {
      const tag = (op.tags && op.tags[0]) || "other";
      (groups[tag] = groups[tag] || []).push(operation(path, method, op));
    }
  const routes = document.getElementById("routes");
  routes.textContent = "";
  for (const [tag, ops] of Object.entries(groups)) routes.append(el("h2", {}, tag), ...ops);
  const schemas = (spec.components && spec.components.schemas) || {};
  routes.append(el("h2", {}, "schemas"));
  for (const [name, s] of Object.entries(schemas))
    routes.append(el("details", {id: "schema-" + name}, el("summary", {}, name),
      el("pre", {}, JSON.stringify(s, null, 2))));
}).catch(e => { document.getElementById("routes").textContent = "cannot load: " + e; });
</script></body></html>
"""


@router.get("/docs", include_in_schema=False, response_class=HTMLResponse)
async def docs_page() -> HTMLResponse:
    """The API reference page (no external assets)."""
    return HTMLResponse(PAGE)


__all__ = ["PAGE", "router"]
