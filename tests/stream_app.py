"""A registry for the stream tests' ``wakeful worker`` subprocesses: ``tests.stream_app:registry``,
an agent on the OpenAI-compatible test server at ``$WAKEFUL_TEST_PROVIDER``."""

from __future__ import annotations

import os

from wakeful.agent import Agent, StreamPolicy
from wakeful.fleet import Registry
from wakeful.providers.openai import OpenAIChat


def registry() -> Registry:
    model = OpenAIChat("gpt-test", base_url=os.environ["WAKEFUL_TEST_PROVIDER"], api_key="k")
    policy = StreamPolicy(
        checkpoint_every_deltas=4,
        checkpoint_every_seconds=0.2,
        checkpoint_min_interval=0.05,
        idle_timeout=30,
        initial_backoff=0.05,
    )
    return Registry().add("writer", Agent("writer", model, "Tell stories.", stream_policy=policy))
