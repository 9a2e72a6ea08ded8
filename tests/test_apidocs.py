"""``GET /docs`` works offline: it references nothing on another host, and its script renders
every operation of the OpenAPI document (run under node with a minimal DOM)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from wakeful.server import create_app
from wakeful.store.memory import MemoryStore

DOM = """
class Node { constructor(tag) { this.tag = tag; this.kids = []; this.attrs = {}; this.text = ""; }
  setAttribute(k, v) { this.attrs[k] = v; } append(...kids) { this.kids.push(...kids); }
  set textContent(v) { this.text = v; this.kids = []; } get textContent() { return this.text; } }
globalThis.Node = Node;
const nodes = {title: new Node("h1"), intro: new Node("div"), routes: new Node("div")};
globalThis.document = {createElement: (t) => new Node(t), getElementById: (id) => nodes[id]};
globalThis.fetch = async (url) => ({json: async () => SPEC});
"""
REPORT = """
setTimeout(() => {
  const summaries = [];
  (function walk(n) {
    if (!(n instanceof Node)) return;
    if (n.tag === "summary") summaries.push(n.kids.filter(k => !(k instanceof Node)).join(""));
    n.kids.forEach(walk);
  })(nodes.routes);
  console.log(JSON.stringify({title: nodes.title.textContent, summaries}));
}, 100);
"""


@pytest.mark.asyncio
async def test_docs_page_loads_nothing_from_another_host() -> None:
    app = create_app(MemoryStore(), tokens={"operator-token": "*"})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        page = await client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert re.findall(r'(?:src|href)="([^"]+)"', page.text) == ["/openapi.json"]
    assert "cdn" not in page.text.lower() and "https://" not in page.text


def test_docs_page_renders_every_operation(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the page's script is not exercised")
    from wakeful.server.apidocs import PAGE

    spec = create_app(MemoryStore(), tokens={"operator-token": "*"}).openapi()
    script = re.search(r"<script>(.*)</script>", PAGE, re.S)
    assert script is not None
    harness = tmp_path / "page.js"
    harness.write_text(f"const SPEC = {json.dumps(spec)};\n{DOM}\n{script.group(1)}\n{REPORT}")
    done = subprocess.run([node, str(harness)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = json.loads(done.stdout)
    assert rendered["title"] == f"{spec['info']['title']} {spec['info']['version']}"
    operations = [(m, p) for p, item in spec["paths"].items() for m in item]
    for method, path in operations:
        assert any(s.strip().startswith(path) for s in rendered["summaries"]), (method, path)
    assert set(spec["components"]["schemas"]) <= set(rendered["summaries"])
