"""What the entry points load, each in a fresh interpreter.

``import litellm`` costs ~5 s and ``mcp`` ~1.5 s: they load only when a
model is called or an MCP server is listed or called, never to import the
package, build a client, declare tools and agents, or print ``chorus
--help`` (which loads no database or Celery code either). The times are
measured by ``bench/imports.py``, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MODEL_AND_MCP = ("litellm", "mcp")
SERVICES = ("sqlalchemy", "sqlmodel", "celery", "kombu", "redis", "psycopg")
#: The HTTP API's framework: only `chorus server` loads it.
SERVER = ("fastapi", "starlette", "uvicorn")
#: JSON-schema validation: loaded where a schema is checked or an answer
#: validated (workers, a submit with an inline output schema), not to build
#: a client.
VALIDATION = ("jsonschema", "referencing", "regex")
#: Celery and its transport: a client loads them when it first sends a task
#: (a submit, a cancel), not to import or build the client or to read.
SENDING = ("celery", "kombu")

#: A client built on an embedded SQLite database, that reads and closes.
CLIENT_THAT_READS = """
import tempfile
from orchestrator import Client, Settings
from orchestrator.errors import InvalidRequestError
from orchestrator.store.migrate import upgrade
with tempfile.TemporaryDirectory() as tmp:
    upgrade(f"sqlite:///{tmp}/db")
    client = Client(Settings(database_url=f"sqlite:///{tmp}/db", redis_url="redis://127.0.0.1:1"))
    try:
        client.job("no-such-job").status()
    except InvalidRequestError:
        pass
    client.close()
"""

#: A client given its own dispatcher (as the test harness gives one), that
#: submits and closes: it sends through that dispatcher, never Celery. (No
#: Redis answers: the submit's live publish fails, and is logged.)
CLIENT_WITH_ITS_DISPATCHER = """
import tempfile
from orchestrator import Client, Settings
from orchestrator.store.migrate import upgrade
from schemas import AgentSpec
class Kept:
    def __init__(self): self.sent = []
    def send(self, actions): self.sent += actions
    def revoke(self, task_ids): pass
with tempfile.TemporaryDirectory() as tmp:
    upgrade(f"sqlite:///{tmp}/db")
    kept = Kept()
    settings = Settings(database_url=f"sqlite:///{tmp}/db", redis_url="redis://127.0.0.1:1")
    client = Client(settings, dispatcher=kept)
    client.submit(AgentSpec(name="own", model="scripted/own"), "hi")
    assert kept.sent and client.dispatcher is kept
    client.close()
"""

#: Prints, as its last line, the top-level packages loaded by the code before it.
REPORT = "import json, sys; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"

#: ``chorus --help`` through the console script's own entry point.
CHORUS_HELP = """
import sys
sys.argv = ["chorus", "--help"]
from orchestrator.cli import main
try:
    main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
"""


def loaded(code: str) -> set[str]:
    """The top-level packages loaded by ``code`` in a new interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\n{REPORT}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


#: What runs, and the packages it must not load.
CASES = {
    "chorus --help": (CHORUS_HELP, MODEL_AND_MCP + SERVICES + SERVER),
    "import orchestrator": ("import orchestrator", MODEL_AND_MCP + SERVICES + SERVER),
    "import orchestrator.errors": ("import orchestrator.errors", MODEL_AND_MCP + SERVICES),
    "from orchestrator import Client": (
        "from orchestrator import Client",
        MODEL_AND_MCP + SERVER + VALIDATION + SENDING,
    ),
    "from orchestrator import AsyncClient": (
        "from orchestrator import AsyncClient",
        MODEL_AND_MCP + SERVER + VALIDATION + SENDING,
    ),
    "a client that only reads": (CLIENT_THAT_READS, MODEL_AND_MCP + SERVER + SENDING),
    "a client with its own dispatcher": (CLIENT_WITH_ITS_DISPATCHER, MODEL_AND_MCP + SENDING),
    "declaring tools and agents": (
        "from orchestrator import Agent, MCPServer, schema_tool, tool",
        MODEL_AND_MCP,
    ),
    "the workers' tasks": ("import workers.tasks", MODEL_AND_MCP),
}


@pytest.mark.parametrize("case", list(CASES))
def test_entry_points_do_not_load_what_they_do_not_use(case: str) -> None:
    code, absent = CASES[case]
    found = loaded(code) & set(absent)
    assert not found, f"{case} loads {sorted(found)}"


def test_the_probe_sees_a_heavy_import() -> None:
    """The control: the MCP client itself does load ``mcp``."""
    assert "mcp" in loaded("import orchestrator.tools.mcp_client")


def test_every_engine_entry_point_is_its_function_whatever_was_imported_first() -> None:
    """A name the engine package exports lazily must not share its name with
    a module of the package: importing that module binds the module on the
    package, where the lazy name was looked for (``engine.sweep(rt)`` then
    called a module)."""
    code = """
import importlib, pkgutil, types
import orchestrator.engine as engine
for found in pkgutil.iter_modules(engine.__path__):
    importlib.import_module(f"orchestrator.engine.{found.name}")
wrong = [n for n in engine.__all__ if isinstance(getattr(engine, n), types.ModuleType)]
assert not wrong, wrong
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
