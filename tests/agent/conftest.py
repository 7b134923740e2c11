"""Fixtures shared by the agent-loop tests: the calc tokenizer and its chat renderer."""

from __future__ import annotations

import pytest
from agent_helpers import tokenizer

from components.agent.render import ChatRenderer
from components.envs import get_task
from components.model.tokenizer import EOS_TOKEN


@pytest.fixture(scope="module")
def tok():
    return tokenizer()


@pytest.fixture(scope="module")
def renderer(tok):
    return ChatRenderer(tok, get_task("calc").tools(), EOS_TOKEN)
