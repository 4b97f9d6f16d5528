"""Structured logs: ids on every line, secrets never."""

from __future__ import annotations

import json
import logging

import pytest

from orchestrator.logs import bind, log_context, redact, setup_logging


@pytest.mark.parametrize(
    ("text", "leak"),
    [
        ("connecting to redis://:hunter2@redis:6379/0", "hunter2"),
        ("postgresql+psycopg://chorus:s3cret@db/chorus", "s3cret"),
        ("Incorrect API key provided: sk-proj-abcdef123456", "abcdef123456"),
        ('{"api_key": "xyz-987"}', "xyz-987"),
        ("Authorization: Bearer tok_55555", "tok_55555"),
        ("password=pa55", "pa55"),
    ],
)
def test_redact_masks_credentials(text: str, leak: str) -> None:
    assert leak not in redact(text)


def test_redact_keeps_ordinary_text() -> None:
    text = "tool weather done (attempt 1) for conversation 5f2a"
    assert redact(text) == text


def test_json_lines_carry_the_bound_ids(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO", "json")
    log = logging.getLogger("chorus.test")
    try:
        with log_context(conversation_id="c1", turn_id="t1"):
            bind(root_id="r1", correlation_id="k1", tool=None)
            log.info("using redis://:pw@host/0")
        log.info("outside")
    finally:
        logging.getLogger().handlers.clear()
    first, second = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["conversation_id"] == "c1" and first["root_id"] == "r1"
    assert first["turn_id"] == "t1" and first["correlation_id"] == "k1"
    assert "tool" not in first
    assert first["message"] == "using redis://:***@host/0"
    assert first["level"] == "INFO" and first["logger"] == "chorus.test"
    assert "conversation_id" not in second
