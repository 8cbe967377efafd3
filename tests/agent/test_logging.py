"""`--log-format=json|text`: one line per record, context from `extra` kept."""

from __future__ import annotations

import io
import json
import logging

import pytest

from sharepack.agent.__main__ import setup_logging


@pytest.fixture
def restore_root_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root_logging")
def test_json_lines_carry_the_message_and_context() -> None:
    out = io.StringIO()
    setup_logging("json", stream=out)
    logging.getLogger("agent.test").warning("xid %d on %s", 79, "GPU-1", extra={"xid": 79, "gpu": "GPU-1"})
    doc = json.loads(out.getvalue())
    assert doc["level"] == "warning" and doc["logger"] == "agent.test"
    assert doc["message"] == "xid 79 on GPU-1"
    assert doc["xid"] == 79 and doc["gpu"] == "GPU-1"
    assert doc["time"].endswith("+00:00")


@pytest.mark.usefixtures("restore_root_logging")
def test_text_lines_append_the_context() -> None:
    out = io.StringIO()
    setup_logging("text", stream=out)
    logging.getLogger("agent.test").info("serving %s", "nvidia.com/gpu", extra={"devices": 8})
    line = out.getvalue().strip()
    assert line.endswith("INFO agent.test: serving nvidia.com/gpu devices=8")
