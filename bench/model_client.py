"""CPU of one streamed model call, on each model-client path, in one run.

Rows (each ms of this process's CPU per call, median over rounds):

* ``litellm`` — :func:`orchestrator.llm.call.complete` with
  ``CHORUS_MODEL_CLIENT=litellm``: ``litellm.completion(stream=True)`` and
  its stream wrapper.
* ``chorus sdk path`` — ``complete()`` with ``CHORUS_MODEL_CLIENT=auto``:
  litellm resolves and maps the call, the openai SDK streams it, litellm
  prices it.
* ``openai SDK alone`` — ``openai.OpenAI(...).chat.completions.create(
  stream=True)`` iterated to the end: the floor.

All three call the same loopback OpenAI-compatible server
(``tests/loopback_llm.py``), run in a subprocess so its CPU is not counted,
answering a short text (``--words`` words, one chunk each, plus usage).
Calls are sequential from one thread; the rounds alternate the rows so
drift on the machine hits them alike. A warm-up call per row comes first.

    PYTHONPATH=. python bench/model_client.py --calls 200 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_API_KEY", "sk-bench")

REPO = Path(__file__).resolve().parent.parent

_SERVER = """
import sys, time
from tests.loopback_llm import LoopbackLLM
text = " ".join(f"word{i}" for i in range(int(sys.argv[1])))
with LoopbackLLM() as server:
    for _ in range(int(sys.argv[2])):
        server.enqueue_text(text, usage=(12, int(sys.argv[1])))
    print(server.base_url, flush=True)
    sys.stdin.read()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per row per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--words", type=int, default=8, help="words (chunks) in the reply")
    args = parser.parse_args()

    total = 3 * (args.calls * args.rounds + 1)
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(args.words), str(total)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    base_url = server.stdout.readline().strip()
    try:
        rows = _rows(base_url)
        results: dict[str, list[float]] = {name: [] for name in rows}
        for call in rows.values():  # warm-up: imports, first connection
            call()
        for _ in range(args.rounds):
            for name, call in rows.items():
                began = time.process_time()
                for _ in range(args.calls):
                    call()
                results[name].append((time.process_time() - began) * 1000 / args.calls)
    finally:
        server.communicate("", timeout=10)
    _print(results, args)


def _rows(base_url: str) -> dict[str, Callable[[], None]]:
    import openai

    from orchestrator.llm.call import complete, model_path

    messages = [{"role": "user", "content": "Say something short."}]
    settings = {"api_base": base_url}
    model = "openai/gpt-4o"

    def through(choice: str) -> Callable[[], None]:
        os.environ["CHORUS_MODEL_CLIENT"] = choice
        path = model_path(model, settings)

        def call() -> None:
            os.environ["CHORUS_MODEL_CLIENT"] = choice
            reply = complete(model, messages, None, settings)
            assert reply.text and reply.usage.output_tokens, reply

        print(f"CHORUS_MODEL_CLIENT={choice}: {path}")
        return call

    sdk = openai.OpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)

    def sdk_alone() -> None:
        stream = sdk.chat.completions.create(
            model="gpt-4o",
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        text = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert "".join(text)

    return {
        "litellm": through("litellm"),
        "chorus sdk path": through("auto"),
        "openai SDK alone": sdk_alone,
    }


def _print(results: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(
        f"\nCPU per streamed call ({args.words}-word reply, {args.calls} calls x "
        f"{args.rounds} rounds; median of rounds [min-max])"
    )
    floor = statistics.median(results["openai SDK alone"])
    for name, values in results.items():
        median = statistics.median(values)
        print(
            f"  {name:<18} {median:6.2f} ms  [{min(values):.2f}-{max(values):.2f}]"
            f"  {median / floor:4.1f}x the SDK alone"
        )


if __name__ == "__main__":
    main()
