"""The size of a model request counts everything sent, not only message text."""

from __future__ import annotations

import json

from orchestrator.ratelimit import request_tokens

TEXT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Book it."}]
ARGUMENTS = json.dumps({"entries": ["2026-11-01; Acme; 100 EUR; invoice 9000"] * 50})
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ledger", "arguments": ARGUMENTS}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "name": "ledger", "content": ARGUMENTS}
DESCRIPTION = "Store ledger entries. " * 50
SCHEMA = {
    "type": "function",
    "function": {
        "name": "ledger",
        "description": DESCRIPTION,
        "parameters": {"type": "object", "properties": {"entries": {"type": "array"}}},
    },
}


def test_tool_call_arguments_results_and_schemas_count() -> None:
    text = request_tokens(TEXT)
    with_call = request_tokens([*TEXT, CALL])
    with_result = request_tokens([*TEXT, CALL, RESULT])
    with_schema = request_tokens([*TEXT, CALL, RESULT], [SCHEMA])
    assert with_call - text >= len(ARGUMENTS) // 4
    assert with_result - with_call >= len(ARGUMENTS) // 4
    assert with_schema - with_result >= len(DESCRIPTION) // 4


def test_text_outside_ascii_counts_more_than_a_quarter_token_a_character() -> None:
    cjk = "東京都は日本の首都です。" * 20
    assert request_tokens([{"role": "user", "content": cjk}]) >= len(cjk)
