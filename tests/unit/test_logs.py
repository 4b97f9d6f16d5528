"""Structured logs: ids on every line, secrets never."""

from __future__ import annotations

import json
import logging

import pytest

from orchestrator.logs import (
    StreamRedaction,
    bind,
    credential_values,
    log_context,
    redact,
    redact_credentials,
    setup_logging,
    treat_as_credentials,
)
from orchestrator.store.values import storable_text


@pytest.mark.parametrize(
    ("text", "leak"),
    [
        ("connecting to redis://:hunter2@redis:6379/0", "hunter2"),
        ("postgresql+psycopg://chorus:s3cret@db/chorus", "s3cret"),
        ("Incorrect API key provided: sk-proj-abcdef123456", "abcdef123456"),
        ('{"api_key": "xyz-987"}', "xyz-987"),
        ("Authorization: Bearer tok_55555", "tok_55555"),
        ("password=pa55", "pa55"),
        ("token ghp_Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2 refused", "Z9y8X7w6V5u4"),
        ("github_pat_11ABCDEFG0_abcdefghijklmnopqrstuv", "11ABCDEFG0_abc"),
        ("Invalid API Key: gsk_abcdefghijklmnopqrstuvwxyz0123", "abcdefghijklmnop"),
        ("aws AKIAABCDEFGHIJKLMNOP denied", "ABCDEFGHIJKLMNOP"),
    ],
)
def test_redact_masks_credentials(text: str, leak: str) -> None:
    assert leak not in redact(text)


def test_redact_masks_the_values_of_held_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given credentials of no known shape in this process's environment
    monkeypatch.setenv("CHORUS_TEST_PROVIDER_API_KEY", "Qv7Lw2Tz9Rb4")
    monkeypatch.setenv("CHORUS_TEST_MCP_HEADER", "Bearer Zx81Yw72Vu63")
    monkeypatch.setenv("CHORUS_TEST_BROKER", "redis://:Pw55Word99@host:6379/0")
    treat_as_credentials(["CHORUS_TEST_MCP_HEADER"])

    # Then their values are masked in logs, errors and stored output alike
    text = "echo Qv7Lw2Tz9Rb4, token Zx81Yw72Vu63, password Pw55Word99"
    for masked in (redact(text), redact_credentials(text), storable_text(text)):
        assert masked == "echo ***, token ***, password ***"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 100])
def test_a_credential_streamed_in_pieces_is_masked_whatever_the_cut(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    monkeypatch.setenv("CHORUS_TEST_PROVIDER_API_KEY", "Qv7Lw2Tz9Rb4")
    text = "key Qv7Lw2Tz9Rb4, almost Qv7Lw2Tz9 and Qv7 Qv7Lw2Tz9Rb4"
    redaction = StreamRedaction()
    shown = [redaction.feed(text[i : i + size]) for i in range(0, len(text), size)]
    shown.append(redaction.end())
    assert "".join(shown) == "key ***, almost Qv7Lw2Tz9 and Qv7 ***"
    assert not any("Qv7Lw2Tz9Rb4" in "".join(shown[:i]) for i in range(len(shown) + 1))
    # a piece that could begin the key waits for the next; other text goes out at once
    assert StreamRedaction().feed("plain text") == "plain text"
    assert StreamRedaction().feed("so Qv7Lw") == "so "


def test_credentials_are_named_like_one_and_look_like_one() -> None:
    environ = {
        "OPENAI_API_KEY": "sk-abc123def456",
        "HF_TOKEN": "hf_a1b2c3d4e5f6",
        "FLOWER_BASIC_AUTH": "admin:Secret99",
        "AUTH_MODE": "standard",  # one kind of character: a word, not a secret
        "GITHUB_TOKEN": "short1",  # too short to mask wherever it appears
        "TOKENIZERS_PARALLELISM": "false-and-more",  # TOKENIZERS is not TOKEN
        "PATH": "/usr/local/bin:/usr/bin",
        "VERTEXAI_CREDENTIALS": '{"type": "service_account", "key_id": "Kf8-x"}',
        "DATABASE": "postgresql://chorus:Db-Pass-42@db/chorus",
    }
    assert credential_values(environ) == {
        "sk-abc123def456",
        "hf_a1b2c3d4e5f6",
        "admin:Secret99",
        "Db-Pass-42",
        '{"type": "service_account", "key_id": "Kf8-x"}',  # whole, not word by word
    }


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
