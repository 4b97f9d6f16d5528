"""Load process of ``bench/throughput.py``: a model client alone, no Chorus.

``--threads`` threads each run turns in a loop against the loopback model
server: a streamed call offering the no-op tool (the server asks for it),
then a streamed call with the tool's result (the server answers text), the
same two requests a Chorus turn makes. ``--client litellm`` calls
``litellm.completion(stream=True)``; ``--client sdk`` calls the openai SDK's
``chat.completions.create(stream=True)`` on one shared client. Both ask for
a usage chunk (``stream_options``), as Chorus does.

The process prints ``ready`` once the client is imported and one turn went
through, then runs until it is terminated. The bench counts calls at the
server and CPU from ``/proc``; errors are printed to stderr (the first few).

    python -m bench.throughput_load --client sdk --base http://127.0.0.1:8089/v1
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.loopback_agent import LOOPBACK_MODEL, bench_noop, job_input
from orchestrator.llm.call import tool_to_openai

SYSTEM = "Benchmark agent: call the no-op tool as told."
MAX_ERRORS_SHOWN = 5


def turn_messages() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The two requests of a turn: before the tool call, and after its result."""
    first = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": job_input(1, 1)},
    ]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bench_noop", "arguments": '{"i": 0}'},
    }
    second = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "name": "bench_noop", "content": "0"},
    ]
    return first, second


def litellm_caller(base: str) -> Callable[[list[dict[str, Any]]], None]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    tools = [tool_to_openai(bench_noop.spec)]

    def call(messages: list[dict[str, Any]]) -> None:
        stream = litellm.completion(
            model=LOOPBACK_MODEL,
            messages=messages,
            tools=tools,
            stream=True,
            stream_options={"include_usage": True},
            api_base=base,
            max_retries=0,
        )
        for _chunk in stream:
            pass

    return call


def sdk_caller(base: str) -> Callable[[list[dict[str, Any]]], None]:
    import openai

    client = openai.OpenAI(base_url=base, max_retries=0)
    tools: Any = [tool_to_openai(bench_noop.spec)]
    model = LOOPBACK_MODEL.split("/", 1)[1]

    def call(messages: list[dict[str, Any]]) -> None:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            tools=tools,
            stream=True,
            stream_options={"include_usage": True},
        )
        for _chunk in stream:
            pass

    return call


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--client", choices=("litellm", "sdk"), required=True)
    p.add_argument("--base", required=True, help="the loopback server's base URL (…/v1)")
    p.add_argument("--threads", type=int, default=100)
    args = p.parse_args(argv)
    call = (litellm_caller if args.client == "litellm" else sdk_caller)(args.base)
    first, second = turn_messages()
    call(first)
    call(second)
    errors = 0
    lock = threading.Lock()

    def loop() -> None:
        nonlocal errors
        while True:
            try:
                call(first)
                call(second)
            except Exception as exc:  # counted and shown: the bench reads the log
                with lock:
                    errors += 1
                    if errors <= MAX_ERRORS_SHOWN:
                        print(f"error: {exc!r}", file=sys.stderr, flush=True)
                time.sleep(0.1)

    for _ in range(args.threads):
        threading.Thread(target=loop, daemon=True).start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
