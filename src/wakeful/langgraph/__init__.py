"""LangGraph's checkpoint saver over any wakeful store (the ``langgraph`` extra).

``graph.compile(checkpointer=WakefulSaver(store))``, or
``async with WakefulSaver.from_url("sqlite:///app.db") as saver``. See docs/langgraph.md.
"""

from __future__ import annotations

try:
    import langgraph.checkpoint.base  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise ModuleNotFoundError(
        "wakeful.langgraph needs LangGraph; install it with: pip install 'wakeful[langgraph]'",
        name=exc.name,
    ) from exc

from wakeful.langgraph.saver import WakefulSaver

__all__ = ["WakefulSaver"]
