"""``chorus`` run in the test's own process, through its entry point
(``orchestrator.cli:main``, what the console script calls): the same
parsing, commands and error handling as the script, without the seconds a
new interpreter spends importing litellm and the test agents."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from orchestrator import Client, Settings, cli


def run_main(
    args: list[str],
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> subprocess.CompletedProcess[str]:
    """``chorus ARGS`` under the ``CHORUS_*`` (and ``COLUMNS``) variables of
    ``env`` (and no other ``CHORUS_*``): its exit status and what it printed,
    like :func:`tests.test_cli.run`."""
    with monkeypatch.context() as patch:
        for key in list(os.environ):
            if key.startswith("CHORUS_") and key not in env:
                patch.delenv(key)
        for key, value in env.items():
            if key.startswith("CHORUS_") or key == "COLUMNS":
                patch.setenv(key, value)
        patch.setattr(sys, "argv", ["chorus", *args])
        # the clients the command makes, closed after it as its process's
        # exit would (their reader threads and connections)
        made: list[Client] = []
        make = cli._client

        def _client(settings: Settings | None = None) -> Client:
            made.append(make(settings))
            return made[-1]

        patch.setattr(cli, "_client", _client)
        capsys.readouterr()  # what the test printed before
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            for client in made:
                client.close()
            gc.unfreeze()  # main() freezes the heap for the interpreter's exit; this one goes on
        out = capsys.readouterr()
    return subprocess.CompletedProcess(["chorus", *args], code, out.out, out.err)
