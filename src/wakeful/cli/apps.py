"""``--app module:attribute`` and ``--tools module:attribute``: loading the user's objects."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click


def load_object(spec: str, option: str = "--app") -> Any:
    """``module:attribute`` -> the object; a usage error names what went wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r} is not of the form module:attribute", param_hint=option)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint=option
        ) from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise click.BadParameter(
            f"{module_name!r} has no attribute {attribute!r}", param_hint=option
        ) from None


def load_registry(spec: str) -> Any:
    """``--app``: a ``Registry``; a single ``Agent`` or compiled graph (registered under its
    name); or a function of no arguments returning one of those. Anything else is a usage
    error naming what was found."""
    from wakeful.agent import Agent
    from wakeful.fleet import Registry
    from wakeful.runtime.graph import CompiledGraph

    value = load_object(spec)
    if callable(value) and not isinstance(value, Registry | Agent | CompiledGraph | type):
        try:
            value = value()
        except TypeError as exc:
            raise click.BadParameter(
                f"{spec} is a function, but calling it without arguments failed: {exc}",
                param_hint="--app",
            ) from None
    if isinstance(value, Registry):
        return value
    if isinstance(value, Agent | CompiledGraph):
        return Registry(default=value.name).add(value.name, value)
    raise click.BadParameter(
        f"{spec} is a {type(value).__name__}; expected a Registry, an Agent, a compiled graph "
        f"(Graph(...).compile()) or a function of no arguments returning one",
        param_hint="--app",
    )


def load_tools(spec: str) -> Any:
    """``--tools``: a mapping of tool names to callables, or a function returning one."""
    value = load_object(spec, "--tools")
    if callable(value) and not hasattr(value, "get"):
        value = value()
    if not hasattr(value, "items"):
        raise click.BadParameter(
            f"{spec} is a {type(value).__name__}; expected a mapping of tool names to functions",
            param_hint="--tools",
        )
    return value
