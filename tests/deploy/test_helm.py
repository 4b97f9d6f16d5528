"""The Helm chart (helm/chorus): lint, render, validate against the Kubernetes
schemas, check what the manifests say, and prove a broken chart fails.

Runs offline once the helm binary is cached (see helm_binary.py); no cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from orchestrator.settings import Settings
from tests.deploy.helm_binary import HelmUnavailable, helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "chorus"
EXAMPLE_VALUES = ROOT / "helm" / "values-example.yaml"
RELEASE = "rel"
NAMESPACE = "chorus"
FULLNAME = "rel-chorus"
#: The Kubernetes version the chart is rendered for, and the schemas it must
#: satisfy: that version and the newest kubernetes-validate ships.
KUBE_VERSION = "1.30.0"
SCHEMA_VERSIONS = sorted({KUBE_VERSION, kubernetes_validate.latest_version()})

DEFAULT_POOLS = {
    "llm": ["worker", "-Q", "llm", "-P", "threads", "-c", "100", "--processes", "1"],
    "tools": ["worker", "-Q", "tools", "-P", "threads", "-c", "32", "--processes", "1"],
    "control": ["worker", "-Q", "control", "-P", "threads", "-c", "16"],
}
PING = 'exec chorus ping --node "$CHORUS_NODE_NAME" --timeout 5'
#: A worker's liveness: its own file, no Redis (orchestrator/liveness.py).
ALIVE = 'exec chorus alive --node "$CHORUS_NODE_NAME" --max-age 60'
#: What pods that never call a model may take from the Secret.
BROKER_KEYS = {"CHORUS_REDIS_URL", "CHORUS_BROKER_URL", "CHORUS_RESULT_BACKEND"}

#: Autoscaling (CPU and queue length), the Flower ingress, an existing
#: Secret, an extra pool, everything optional switched on.
FULL_VALUES: dict[str, Any] = {
    "existingSecret": "chorus-env",
    "config": {"CHORUS_MODULES": "examples.parallel_tools"},
    "prometheus": {"annotate": "both"},
    "workers": {
        "pools": {
            "llm": {
                "autoscaling": {
                    "enabled": True,
                    "minReplicas": 2,
                    "maxReplicas": 12,
                    "queueLength": {"enabled": True, "targetAverageValue": 30},
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
                }
            },
            "tools": {"autoscaling": {"enabled": True}},
            "gpu": {"queues": ["gpu", "gpu-batch"], "pool": "solo", "replicas": 1},
        }
    },
    "flower": {
        "urlPrefix": "flower",
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "hosts": [
                {"host": "chorus.example.com", "paths": [{"path": "/flower", "pathType": "Prefix"}]}
            ],
            "tls": [{"secretName": "chorus-tls", "hosts": ["chorus.example.com"]}],
        },
    },
    "server": {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "hosts": [{"host": "api.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
        },
    },
}

Manifest = dict[str, Any]
Helm = Callable[..., subprocess.CompletedProcess[str]]


# -- helpers -------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """Run the cached helm binary with its homes in a temp dir and no cluster."""
    try:
        binary = helm_binary()
    except HelmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(binary), *args], env=env, capture_output=True, text=True, timeout=60
        )
        if check and proc.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run


def write_values(tmp_path: Path, values: dict[str, Any], name: str = "values.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


def template(
    helm: Helm, *values_files: Path, sets: tuple[str, ...] = (), chart: Path = CHART
) -> str:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    args += ["--kube-version", KUBE_VERSION]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return helm(*args).stdout


def render(helm: Helm, *values_files: Path, sets: tuple[str, ...] = ()) -> list[Manifest]:
    docs = yaml.safe_load_all(template(helm, *values_files, sets=sets))
    return [d for d in docs if d]


def schema_errors(manifests: list[Manifest], version: str) -> list[str]:
    """Strict validation (unknown fields rejected) of every manifest; a kind
    without a schema is an error too."""
    errors = []
    for m in manifests:
        where = f"{m.get('kind')}/{m.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(m, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{where}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{where}: {exc.message}")
    return errors


def by_kind(manifests: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def one(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    found = by_kind(manifests, kind)
    assert name in found, f"no {kind}/{name} among {sorted(found)}"
    return found[name]


def pod_spec(workload: Manifest) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: Manifest) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def chorus_workloads(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in ("Deployment", "Job")]


# -- scenarios -----------------------------------------------------------------


@pytest.fixture(scope="module")
def full_values(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_values(tmp_path_factory.mktemp("values"), FULL_VALUES)


@pytest.fixture(scope="module")
def default_manifests(helm: Helm) -> list[Manifest]:
    return render(helm)


@pytest.fixture(scope="module")
def full_manifests(helm: Helm, full_values: Path) -> list[Manifest]:
    return render(helm, full_values)


SCENARIOS = ["default", "full", "example"]


def scenario_files(name: str, full_values: Path) -> list[Path]:
    return {"default": [], "full": [full_values], "example": [EXAMPLE_VALUES]}[name]


# -- lint and schemas ----------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(helm: Helm, full_values: Path, scenario: str) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
    for f in scenario_files(scenario, full_values):
        args += ["-f", str(f)]
    proc = helm(*args)
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_manifest_validates(
    helm: Helm, full_values: Path, scenario: str, version: str
) -> None:
    manifests = render(helm, *scenario_files(scenario, full_values))
    assert len(manifests) >= 8
    assert schema_errors(manifests, version) == []


def test_kubernetes_validate_cli_agrees(helm: Helm, full_values: Path, tmp_path: Path) -> None:
    """The same check through the documented CLI, on the rendered files."""
    out = tmp_path / "rendered"
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    helm(*args, "--kube-version", KUBE_VERSION, "-f", str(full_values), "--output-dir", str(out))
    files = sorted(str(p) for p in out.rglob("*.yaml"))
    assert len(files) >= 8
    command = [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet"]
    proc = subprocess.run(
        [*command, "-k", KUBE_VERSION, *files], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- what the default release contains ----------------------------------------


def test_a_deployment_per_default_pool(default_manifests: list[Manifest]) -> None:
    deployments = by_kind(default_manifests, "Deployment")
    workers = {n for n in deployments if n.startswith(f"{FULLNAME}-worker-")}
    assert workers == {f"{FULLNAME}-worker-{p}" for p in DEFAULT_POOLS}
    for pool, expected in DEFAULT_POOLS.items():
        deployment = deployments[f"{FULLNAME}-worker-{pool}"]
        c = container(deployment)
        # the image has no entrypoint (CMD chorus --help): name the program
        assert c["command"] == ["chorus"]
        assert c["args"][: len(expected)] == expected
        assert c["args"][len(expected) :] == ["-n", "$(CHORUS_NODE_NAME)", "-l", "INFO"]
        # POD_NAME comes from the downward API and is declared before the node
        # name that expands it (Kubernetes only expands earlier variables).
        env = list(env_of(c))
        assert env.index("POD_NAME") < env.index("CHORUS_NODE_NAME")
        assert env_of(c)["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env_of(c)["CHORUS_NODE_NAME"]["value"] == f"{pool}@$(POD_NAME)"
        # liveness must not depend on Redis (an outage would restart every
        # worker and cut off paid model calls); readiness may
        assert c["livenessProbe"]["exec"]["command"] == ["sh", "-c", ALIVE]
        assert c["readinessProbe"]["exec"]["command"] == ["sh", "-c", PING]
        assert c["readinessProbe"]["timeoutSeconds"] > 5  # the ping's timeout, plus start-up
        assert deployment["spec"]["replicas"] >= 1
        assert c["resources"]["requests"]["cpu"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["chorus/pool"] == pool
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_no_optional_objects_by_default(default_manifests: list[Manifest]) -> None:
    kinds = {m["kind"] for m in default_manifests}
    assert "HorizontalPodAutoscaler" not in kinds
    assert "Ingress" not in kinds


def test_beat_is_a_single_recreated_replica(default_manifests: list[Manifest]) -> None:
    beat = one(default_manifests, "Deployment", f"{FULLNAME}-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert container(beat)["command"] == ["chorus"]
    assert container(beat)["args"][0] == "beat"
    # beat writes its schedule under CHORUS_STATE_DIR: a mounted, writable volume
    mounts = {m["mountPath"] for m in container(beat)["volumeMounts"]}
    config = one(default_manifests, "ConfigMap", f"{FULLNAME}-config")
    assert config["data"]["CHORUS_STATE_DIR"] in mounts
    # and has a liveness probe: the last task it sent, at most 300 s ago
    probe = container(beat)["livenessProbe"]
    argv = probe["exec"]["command"]
    assert argv == ["chorus", "alive", "--node", "beat", "--max-age", "300"]
    assert float(argv[-1]) > 2 * float(config["data"]["CHORUS_SWEEP_INTERVAL"])
    env = container_environment(default_manifests, container(beat))
    assert run_help(argv, env).returncode == 0


@pytest.mark.parametrize("scenario", ["default", "full"])
def test_pods_that_never_call_a_model_get_no_provider_keys(
    helm: Helm, full_values: Path, scenario: str
) -> None:
    sets = () if scenario == "full" else ("secret.env.OPENAI_API_KEY=sk-not-for-flower",)
    manifests = render(helm, *scenario_files(scenario, full_values), sets=sets)
    secret = "chorus-env" if scenario == "full" else f"{FULLNAME}-env"
    for name in ("beat", "flower", "metrics", "server"):
        c = container(one(manifests, "Deployment", f"{FULLNAME}-{name}"))
        assert not [s for s in c.get("envFrom", []) if "secretRef" in s], name
        refs = {
            e["valueFrom"]["secretKeyRef"]["key"]: e["valueFrom"]["secretKeyRef"]["name"]
            for e in c["env"]
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        allowed = BROKER_KEYS | {
            "flower": {"FLOWER_BASIC_AUTH"},
            "metrics": {"CHORUS_DATABASE_URL"},
            "server": {"CHORUS_DATABASE_URL"},
        }.get(name, set())
        assert "CHORUS_REDIS_URL" in refs and refs.keys() <= allowed, (name, refs)
        assert set(refs.values()) == {secret}
        assert "OPENAI_API_KEY" not in container_environment(manifests, c)
    for pool in DEFAULT_POOLS:  # the workers call models and tools: the whole Secret
        c = container(one(manifests, "Deployment", f"{FULLNAME}-worker-{pool}"))
        assert {"secretRef": {"name": secret}} in c["envFrom"]


def test_migration_is_a_pre_install_and_pre_upgrade_hook(
    default_manifests: list[Manifest],
) -> None:
    job = one(default_manifests, "Job", f"{FULLNAME}-migration")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    c = container(job)
    assert (c["command"], c["args"]) == (["chorus"], ["db", "upgrade"])
    assert pod_spec(job)["restartPolicy"] == "Never"
    # Hooks run before the release's ConfigMap, Secret and ServiceAccount exist:
    # the Job uses none of them, only a hook Secret created just before it.
    assert "envFrom" not in c
    assert "serviceAccountName" not in pod_spec(job)
    ref = env_of(c)["CHORUS_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    hook_secret = one(default_manifests, "Secret", ref["name"])
    hook = hook_secret["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == annotations["helm.sh/hook"]
    assert int(hook["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    assert ref["key"] in hook_secret["stringData"]


def test_config_and_secret(default_manifests: list[Manifest]) -> None:
    config = one(default_manifests, "ConfigMap", f"{FULLNAME}-config")["data"]
    for key in ("CHORUS_MODULES", "CHORUS_REDIS_PREFIX", "CHORUS_STALL_TIMEOUT"):
        assert key in config
    assert all(isinstance(v, str) for v in config.values())
    assert not any(k.endswith("_URL") for k in config)
    secret = one(default_manifests, "Secret", f"{FULLNAME}-env")
    assert {"CHORUS_REDIS_URL", "CHORUS_DATABASE_URL"} <= secret["stringData"].keys()
    for workload in by_kind(default_manifests, "Deployment").values():
        sources = container(workload)["envFrom"]
        assert {"configMapRef": {"name": f"{FULLNAME}-config"}} in sources
        if "-worker-" in workload["metadata"]["name"]:
            assert {"secretRef": {"name": f"{FULLNAME}-env"}} in sources
        else:  # only the keys it needs (test_pods_that_never_call_a_model_...)
            assert "CHORUS_REDIS_URL" in env_of(container(workload))
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/config"])
        assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/secret"])


def test_a_config_change_rolls_the_pods(helm: Helm, default_manifests: list[Manifest]) -> None:
    changed = render(helm, sets=("config.CHORUS_STALL_TIMEOUT=300",))
    name = f"{FULLNAME}-worker-llm"
    before = one(default_manifests, "Deployment", name)["spec"]["template"]["metadata"]
    after = one(changed, "Deployment", name)["spec"]["template"]["metadata"]
    assert before["annotations"]["checksum/config"] != after["annotations"]["checksum/config"]
    assert before["annotations"]["checksum/secret"] == after["annotations"]["checksum/secret"]


def test_large_numbers_render_without_exponent(helm: Helm) -> None:
    config = one(
        render(helm, sets=("config.CHORUS_MAX_INPUT_CHARS=1000000",)),
        "ConfigMap",
        f"{FULLNAME}-config",
    )
    assert config["data"]["CHORUS_MAX_INPUT_CHARS"] == "1000000"


def test_flower_and_its_service(default_manifests: list[Manifest]) -> None:
    flower = one(default_manifests, "Deployment", f"{FULLNAME}-flower")
    c = container(flower)
    # The Chorus app (workers/main.py) carries the Redis key prefix.
    assert c["command"] == ["celery"]
    assert c["args"][:3] == ["-A", "workers.main", "flower"]
    assert env_of(c)["FLOWER_UNAUTHENTICATED_API"]["value"] == "false"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthcheck"
    service = one(default_manifests, "Service", f"{FULLNAME}-flower")
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_metrics_exporter(helm: Helm, default_manifests: list[Manifest]) -> None:
    exporter = one(default_manifests, "Deployment", f"{FULLNAME}-metrics")
    c = container(exporter)
    assert (c["command"], c["args"]) == (["chorus"], ["metrics", "--port", "9108"])
    service = one(default_manifests, "Service", f"{FULLNAME}-metrics")
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9108",
        "prometheus.io/path": "/metrics",
    }
    assert service["spec"]["ports"][0]["port"] == 9108
    off = render(helm, sets=("metrics.enabled=false",))
    assert not [m for m in off if m["metadata"]["name"] == f"{FULLNAME}-metrics"]


def test_http_api_server(helm: Helm, default_manifests: list[Manifest]) -> None:
    server = one(default_manifests, "Deployment", f"{FULLNAME}-server")
    c = container(server)
    assert c["command"] == ["chorus"]
    assert c["args"][:5] == ["server", "--host", "0.0.0.0", "--port", "8000"]
    # liveness is the process (an outage of Postgres or Redis does not
    # restart it); readiness is Postgres and Redis
    assert c["livenessProbe"]["httpGet"] == {"path": "/v1/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v1/ready", "port": "http"}
    assert server["spec"]["replicas"] >= 1
    service = one(default_manifests, "Service", f"{FULLNAME}-server")
    assert service["spec"]["ports"][0] == {
        "name": "http",
        "port": 8000,
        "targetPort": "http",
        "protocol": "TCP",
    }
    off = render(helm, sets=("server.enabled=false",))
    assert not [m for m in off if m["metadata"]["name"] == f"{FULLNAME}-server"]


def test_server_ingress(full_manifests: list[Manifest]) -> None:
    ingress = one(full_manifests, "Ingress", f"{FULLNAME}-server")
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "api.example.com"
    [path] = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": f"{FULLNAME}-server", "port": {"number": 8000}}


@pytest.mark.parametrize("scenario", ["default", "full"])
def test_services_select_pods_and_ports_exist(
    scenario: str, default_manifests: list[Manifest], full_manifests: list[Manifest]
) -> None:
    manifests = default_manifests if scenario == "default" else full_manifests
    pods = [m["spec"]["template"] for m in by_kind(manifests, "Deployment").values()]
    for service in by_kind(manifests, "Service").values():
        selector = service["spec"]["selector"]
        matching = [p for p in pods if selector.items() <= p["metadata"]["labels"].items()]
        assert len(matching) == 1, service["metadata"]["name"]
        ports = {p["name"] for c in matching[0]["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports


def _cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_threads_workers_request_a_core_per_process(
    helm: Helm, full_values: Path, scenario: str
) -> None:
    # One threads process is bound by the GIL to one core: a pod running N
    # of them asks for N cores, so scaling pods scales cores.
    manifests = render(helm, *scenario_files(scenario, full_values))
    for pool in ("llm", "tools"):
        c = container(one(manifests, "Deployment", f"{FULLNAME}-worker-{pool}"))
        assert _option(c["args"], "-P") == "threads"
        processes = int(_option(c["args"], "--processes") or 1)
        assert _cores(c["resources"]["requests"]["cpu"]) == processes, pool


def test_the_tools_pool_is_not_capped_at_the_core_count(default_manifests: list[Manifest]) -> None:
    # A parallel batch of tools waiting on I/O runs at once.
    c = container(one(default_manifests, "Deployment", f"{FULLNAME}-worker-tools"))
    assert int(_option(c["args"], "-c") or 0) >= 32


@pytest.mark.parametrize("processes", ["4", "auto"])
def test_processes_of_a_pool(helm: Helm, processes: str) -> None:
    value = f"workers.pools.llm.processes={processes}"
    manifests = render(helm, sets=(value,))
    c = container(one(manifests, "Deployment", f"{FULLNAME}-worker-llm"))
    assert _option(c["args"], "--processes") == processes


def test_a_pool_can_be_switched_off(helm: Helm) -> None:
    manifests = render(helm, sets=("workers.pools.tools.enabled=false",))
    names = set(by_kind(manifests, "Deployment"))
    assert f"{FULLNAME}-worker-tools" not in names
    assert f"{FULLNAME}-worker-llm" in names


def test_every_setting_is_in_the_config_or_the_secret(helm: Helm) -> None:
    manifests = render(
        helm,
        sets=("secret.brokerUrl=redis://broker:6379/1", "secret.resultBackend=redis://rb:6379/2"),
    )
    config = one(manifests, "ConfigMap", f"{FULLNAME}-config")["data"]
    secret = one(manifests, "Secret", f"{FULLNAME}-env")["stringData"]
    settings = {f"CHORUS_{name.upper()}" for name in Settings.model_fields}
    missing = settings - config.keys() - secret.keys()
    assert not missing, f"neither values.yaml `config` nor the Secret sets {sorted(missing)}"
    assert not config.keys() & secret.keys()


# -- every command is one the CLI accepts -----------------------------------------

#: How each program a container runs is reached from this test's interpreter.
CLIS = {
    "chorus": [sys.executable, "-m", "orchestrator.cli"],
    "celery": [sys.executable, "-m", "celery"],
}
SAMPLE_POD = "rel-chorus-worker-llm-5d8f7c9b4-x2x7q"


def container_environment(manifests: list[Manifest], c: dict[str, Any]) -> dict[str, str]:
    """The environment Kubernetes gives container C: its ConfigMap and Secret
    (envFrom), then its env with $(VAR) expanded; the pod name is a sample."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            env.update(one(manifests, "ConfigMap", source["configMapRef"]["name"])["data"])
        elif "secretRef" in source:
            env.update(one(manifests, "Secret", source["secretRef"]["name"])["stringData"])
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif var["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = SAMPLE_POD
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            rendered = by_kind(manifests, "Secret").get(ref["name"])
            if rendered is None:
                continue  # an existing Secret: its keys are the cluster's
            data = rendered["stringData"]
            assert ref["key"] in data or ref.get("optional"), f"{ref} is required"
            if ref["key"] in data:
                env[var["name"]] = data[ref["key"]]
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def run_help(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ARGV with `--help` appended, from the repo root (the image's /app)."""
    program, *args = argv
    assert program in CLIS, f"{argv} runs neither chorus nor celery"
    env = {
        **env,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(ROOT),
        "PYTHONPATH": str(ROOT),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    return subprocess.run(
        [*CLIS[program], *args, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def workload_names() -> list[str]:
    pools = [f"worker-{p}" for p in DEFAULT_POOLS]
    return [*pools, "beat", "flower", "metrics", "server", "migration"]


@pytest.mark.parametrize("name", workload_names())
def test_command_is_accepted_by_its_cli(default_manifests: list[Manifest], name: str) -> None:
    kind = "Job" if name == "migration" else "Deployment"
    c = container(one(default_manifests, kind, f"{FULLNAME}-{name}"))
    env = container_environment(default_manifests, c)
    argv = [expand(word, env) for word in [*c["command"], *c.get("args", [])]]
    assert not [w for w in argv if "$(" in w], f"unexpanded variable in {argv}"
    out = run_help(argv, env)
    assert out.returncode == 0, f"{shlex.join(argv)} --help:\n{out.stdout}{out.stderr}"
    assert "Usage" in out.stdout


def test_flower_options_exist(full_manifests: list[Manifest]) -> None:
    """Flower passes its own options to tornado, which `--help` does not check."""
    from flower.options import options

    c = container(one(full_manifests, "Deployment", f"{FULLNAME}-flower"))
    flags = [a for a in c["args"][c["args"].index("flower") + 1 :] if a.startswith("--")]
    assert flags
    for flag in flags:
        assert flag[2:].split("=")[0] in options, flag


@pytest.mark.parametrize(("probe", "command"), [("liveness", "alive"), ("readiness", "ping")])
@pytest.mark.parametrize("pool", DEFAULT_POOLS)
def test_worker_probe_is_accepted_by_the_cli(
    default_manifests: list[Manifest], pool: str, probe: str, command: str
) -> None:
    c = container(one(default_manifests, "Deployment", f"{FULLNAME}-worker-{pool}"))
    env = container_environment(default_manifests, c)
    shell, flag, script = c[f"{probe}Probe"]["exec"]["command"]
    assert (shell, flag) == ("sh", "-c")
    words = shlex.split(re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], script))
    assert words[0] == "exec"
    argv = words[1:]
    assert argv[:2] == ["chorus", command]
    # the node the probe pings is the one the worker was started as
    worker_args = [expand(a, env) for a in c["args"]]
    node = worker_args[worker_args.index("-n") + 1]
    assert node == f"{pool}@{SAMPLE_POD}"
    assert argv[argv.index("--node") + 1] == node
    out = run_help(argv, env)
    assert out.returncode == 0, f"{shlex.join(argv)} --help:\n{out.stdout}{out.stderr}"


# -- the optional parts switched on -------------------------------------------


def test_existing_secret_replaces_the_chart_secret(full_manifests: list[Manifest]) -> None:
    assert by_kind(full_manifests, "Secret") == {}
    for workload in chorus_workloads(full_manifests):
        c = container(workload)
        refs = [s["secretRef"]["name"] for s in c.get("envFrom", []) if "secretRef" in s]
        refs += [
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        ]
        assert refs, workload["metadata"]["name"]
        assert set(refs) == {"chorus-env"}
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        assert "checksum/secret" not in annotations


def test_hpa_per_autoscaled_pool(full_manifests: list[Manifest]) -> None:
    hpas = by_kind(full_manifests, "HorizontalPodAutoscaler")
    assert set(hpas) == {f"{FULLNAME}-worker-llm", f"{FULLNAME}-worker-tools"}
    deployments = by_kind(full_manifests, "Deployment")
    for name, hpa in hpas.items():
        assert hpa["apiVersion"] == "autoscaling/v2"
        target = hpa["spec"]["scaleTargetRef"]
        assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert "replicas" not in deployments[name]["spec"]  # left to the HPA
        cpu = [m for m in hpa["spec"]["metrics"] if m["type"] == "Resource"]
        assert cpu[0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    llm = hpas[f"{FULLNAME}-worker-llm"]["spec"]
    assert (llm["minReplicas"], llm["maxReplicas"]) == (2, 12)
    assert llm["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 300}}
    [external] = [m["external"] for m in llm["metrics"] if m["type"] == "External"]
    assert external["metric"]["name"] == "chorus_queue_depth"  # the exporter's gauge
    assert external["metric"]["selector"]["matchExpressions"] == [
        {"key": "queue", "operator": "In", "values": ["llm"]}
    ]
    assert external["target"] == {"type": "AverageValue", "averageValue": "30"}
    # pools without autoscaling keep their replicas
    assert deployments[f"{FULLNAME}-worker-control"]["spec"]["replicas"] == 1


def test_an_added_pool(full_manifests: list[Manifest]) -> None:
    gpu = one(full_manifests, "Deployment", f"{FULLNAME}-worker-gpu")
    assert container(gpu)["args"][:5] == ["worker", "-Q", "gpu,gpu-batch", "-P", "solo"]
    assert "-c" not in container(gpu)["args"]  # chorus worker's own default


def test_flower_ingress(full_manifests: list[Manifest]) -> None:
    ingress = one(full_manifests, "Ingress", f"{FULLNAME}-flower")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "chorus.example.com"
    [path] = rule["http"]["paths"]
    assert path["path"] == "/flower"
    assert path["backend"]["service"] == {"name": f"{FULLNAME}-flower", "port": {"number": 5555}}
    assert ingress["spec"]["tls"] == [{"hosts": ["chorus.example.com"], "secretName": "chorus-tls"}]
    flower = container(one(full_manifests, "Deployment", f"{FULLNAME}-flower"))
    assert "--url_prefix=flower" in flower["args"]
    assert flower["readinessProbe"]["httpGet"]["path"] == "/flower/healthcheck"
    # behind an Ingress, Flower does not start without basic auth
    assert env_of(flower)["FLOWER_UNAUTHENTICATED_API"]["value"] == "false"
    auth = env_of(flower)["FLOWER_BASIC_AUTH"]["valueFrom"]["secretKeyRef"]
    assert auth == {"name": "chorus-env", "key": "FLOWER_BASIC_AUTH"}  # not optional


def test_a_flower_ingress_needs_basic_auth(helm: Helm) -> None:
    ingress = ("flower.ingress.enabled=true",)
    args = ["template", RELEASE, str(CHART)]
    unauthenticated = helm(*args, "--set", ingress[0], check=False)
    assert unauthenticated.returncode != 0
    assert "set secret.env.FLOWER_BASIC_AUTH" in unauthenticated.stderr
    with_auth = ("flower.ingress.enabled=true", "secret.env.FLOWER_BASIC_AUTH=admin:s3cret")
    opened = helm(
        *args, *(f"--set={v}" for v in (*with_auth, "flower.unauthenticatedApi=true")), check=False
    )
    assert opened.returncode != 0 and "flower.unauthenticatedApi=false" in opened.stderr
    manifests = render(helm, sets=with_auth)
    assert by_kind(manifests, "Ingress")
    flower = container(one(manifests, "Deployment", f"{FULLNAME}-flower"))
    env = container_environment(manifests, flower)
    assert env["FLOWER_BASIC_AUTH"] == "admin:s3cret"
    assert "optional" not in env_of(flower)["FLOWER_BASIC_AUTH"]["valueFrom"]["secretKeyRef"]


def test_prometheus_annotations_on_pods_when_asked(full_manifests: list[Manifest]) -> None:
    for name, port, path in (
        ("metrics", "9108", "/metrics"),
        ("flower", "5555", "/flower/metrics"),
    ):
        pod = one(full_manifests, "Deployment", f"{FULLNAME}-{name}")["spec"]["template"]
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == port
        assert annotations["prometheus.io/path"] == path


# -- a broken chart fails ------------------------------------------------------


@pytest.fixture
def chart_copy(tmp_path: Path) -> Path:
    """A copy of the chart to break."""
    copy = tmp_path / "chorus"
    shutil.copytree(CHART, copy)
    return copy


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, 1))


def render_chart(helm: Helm, chart: Path) -> list[Manifest]:
    docs = yaml.safe_load_all(template(helm, chart=chart))
    return [d for d in docs if d]


def test_a_misspelt_field_fails_validation(helm: Helm, chart_copy: Path) -> None:
    """Valid YAML, renders and lints fine, but is not a Kubernetes object."""
    _edit(
        chart_copy / "templates" / "worker-deployments.yaml",
        "terminationGracePeriodSeconds:",
        "terminationGracePeriodSecond:",
    )
    helm("lint", "--strict", str(chart_copy))  # lint alone does not see it
    errors = schema_errors(render_chart(helm, chart_copy), KUBE_VERSION)
    assert len(errors) == len(DEFAULT_POOLS)
    assert all("terminationGracePeriodSecond" in e for e in errors)


def test_a_field_at_the_wrong_level_fails_validation(helm: Helm, chart_copy: Path) -> None:
    """resources moved from the container up to the pod spec."""
    _edit(
        chart_copy / "templates" / "beat-deployment.yaml",
        "          resources:\n            {{- toYaml . | nindent 12 }}",
        "      resources:\n        {{- toYaml . | nindent 8 }}",
    )
    errors = schema_errors(render_chart(helm, chart_copy), KUBE_VERSION)
    assert errors and all(e.startswith(f"Deployment/{FULLNAME}-beat") for e in errors)


def test_a_wrong_type_fails_validation(helm: Helm, chart_copy: Path) -> None:
    _edit(
        chart_copy / "templates" / "metrics-service.yaml",
        "port: {{ $port }}",
        "port: {{ $port | quote }}",
    )
    errors = schema_errors(render_chart(helm, chart_copy), KUBE_VERSION)
    assert errors == [
        f"Service/{FULLNAME}-metrics: spec.ports.0.port: '9108' is not of type 'integer'"
    ]


def test_a_template_syntax_error_fails_lint(helm: Helm, chart_copy: Path) -> None:
    _edit(chart_copy / "templates" / "beat-deployment.yaml", "{{- end }}\n", "\n")
    proc = helm("lint", "--strict", str(chart_copy), check=False)
    assert proc.returncode != 0
    assert "beat-deployment.yaml" in proc.stdout + proc.stderr


def test_a_lint_warning_fails_strict_lint(helm: Helm, chart_copy: Path) -> None:
    _edit(chart_copy / "Chart.yaml", "version: 0.1.0", "version: not-semver")
    proc = helm("lint", "--strict", str(chart_copy), check=False)
    assert proc.returncode != 0


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("workers.pools.llm.pool=fork", "workers.pools.llm.pool"),
        ("workers.pools.llm.concurrency=0", "workers.pools.llm.concurrency"),
        ("workers.pools.llm.processes=0", "workers.pools.llm.processes"),
        ("workers.pools.llm.processes=many", "workers.pools.llm.processes"),
        ("workers.pools.Bad_Name.queues={x}", "workers.pools"),
        ("workers.pools.llm.queus={llm}", "queus"),
        ("existingSecrets=typo", "existingSecrets"),
        ("prometheus.annotate=everything", "prometheus.annotate"),
        ("config.bad-name=1", "bad-name"),
    ],
)
def test_bad_values_are_refused(helm: Helm, setting: str, message: str) -> None:
    args = ["template", RELEASE, str(CHART), "--set", setting]
    proc = helm(*args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["secret.redisUrl="], "set secret.redisUrl"),
        (["secret.databaseUrl="], "set secret.databaseUrl"),
        (
            [
                "workers.pools.llm.autoscaling.enabled=true",
                "workers.pools.llm.autoscaling.targetCPUUtilizationPercentage=0",
            ],
            "enable at least one metric",
        ),
        (
            ["workers.pools.tools.pool=prefork", "workers.pools.tools.processes=2"],
            "processes is for threads or gevent pools",
        ),
        (["workers.probes.readiness.timeoutSeconds=5"], "must exceed workers.probes.pingTimeout"),
        (["beat.liveness.maxAgeSeconds=60"], "must exceed twice config.CHORUS_SWEEP_INTERVAL"),
    ],
)
def test_inconsistent_values_are_refused(helm: Helm, settings: list[str], message: str) -> None:
    args = ["template", RELEASE, str(CHART)]
    for setting in settings:
        args += ["--set", setting]
    proc = helm(*args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_a_pool_may_set_its_own_grace_period(helm: Helm) -> None:
    manifests = render(helm, sets=("workers.pools.llm.terminationGracePeriodSeconds=600",))
    grace = {
        name.removeprefix(f"{FULLNAME}-worker-"): pod_spec(d)["terminationGracePeriodSeconds"]
        for name, d in by_kind(manifests, "Deployment").items()
        if "-worker-" in name
    }
    assert grace == {"llm": 600, "tools": 120, "control": 120}
