"""What it costs to start: ``chorus --help``, ``import orchestrator`` and
``from orchestrator import Client``, each in a fresh interpreter.

Prints, for each command, the median wall and CPU time over ``--runs``
runs beside its target and the figure before the layers were made one-way
(main at e7d1dd9, on the same machines), then the packages that cost the
most under ``python -X importtime`` (self time summed per top-level
package). ``--compare DIR`` measures another checkout the same way, side by
side (e.g. ``--compare /work/main``).

The machines are shared: wall time moves with the load average (printed),
CPU time less but visibly on a saturated machine; the ratio to a checkout
measured in the same run (``--compare``) is the figure to trust.

    .venv/bin/python bench/imports.py [--runs 7] [--compare DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Label → the arguments after the interpreter. ``chorus`` is the console
#: script ``orchestrator.cli:main``; run with ``-m`` so that ``--compare``
#: measures the other checkout's code, not this one's installed script.
COMMANDS = {
    "chorus --help": ["-m", "orchestrator.cli", "--help"],
    "import orchestrator": ["-c", "import orchestrator"],
    "from orchestrator import Client": ["-c", "from orchestrator import Client"],
}

#: The issue's aims, in seconds of wall time on these machines.
TARGETS = {
    "chorus --help": 0.5,
    "import orchestrator": 0.5,
    "from orchestrator import Client": 1.0,
}

#: Before (main at e7d1dd9, an eager ``orchestrator/__init__`` loading
#: ~1,200 modules for any of the three): (median wall s, median CPU s).
#: Wall: the figures the issue's work started from on these machines
#: (``import orchestrator`` loaded what ``from orchestrator import Client``
#: did); CPU: this script with ``--compare``, 5 runs at load average 3.3.
BEFORE = {
    "chorus --help": (1.4, 1.43),
    "import orchestrator": (1.3, 1.48),
    "from orchestrator import Client": (1.3, 1.32),
}


def run_once(args: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=_env()
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


#: Bytecode of every measured checkout goes here, not into the checkout.
PYCACHE = Path(tempfile.gettempdir()) / "chorus-bench-imports-pycache"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the checkout in cwd is the one imported
    # Bytecode is written under the prefix (never into the checkout): with
    # writing off, every run would compile every module and measure that.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def measure(cwd: Path, runs: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each command, run in ``cwd``."""
    figures = {}
    for label, args in COMMANDS.items():
        run_once(args, cwd)  # warm the file cache and the bytecode
        samples = [run_once(args, cwd) for _ in range(runs)]
        figures[label] = (
            statistics.median(s[0] for s in samples),
            statistics.median(s[1] for s in samples),
        )
    return figures


def importtime(args: list[str], cwd: Path) -> tuple[Counter[str], int]:
    """Self import time (µs) per top-level package, and the modules loaded."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env=_env(),
    )
    per_package: Counter[str] = Counter()
    modules = 0
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or line.endswith("| imported package"):
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:") :].split("|"))
        per_package[name.split(".")[0]] += int(self_us)
        modules += 1
    return per_package, modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--compare", type=Path, help="another checkout, measured the same way")
    options = parser.parse_args()

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, {options.runs} runs")
    here = measure(REPO, options.runs)
    other = measure(options.compare, options.runs) if options.compare else {}
    header = f"{'command':34} {'target':>7} {'wall':>6} {'cpu':>6}"
    header += f"   {'before: wall':>12} {'cpu':>5}"
    if other:
        header += f"   {'compare: wall':>13} {'cpu':>5}"
    print(header)
    for label, (wall, cpu) in here.items():
        mark = "ok" if wall < TARGETS[label] else "OVER"
        old_wall, old_cpu = BEFORE[label]
        row = (
            f"{label:34} {TARGETS[label]:>6.1f}s {wall:>5.2f}s {cpu:>5.2f}s"
            f"   {old_wall:>11.2f}s {old_cpu:>4.2f}s"
        )
        if other:
            row += f"   {other[label][0]:>12.2f}s {other[label][1]:>4.2f}s"
        print(f"{row}  {mark}")

    print("\nself import time per package (python -X importtime, one run):")
    for label, args in COMMANDS.items():
        per_package, modules = importtime(args, REPO)
        top = ", ".join(f"{name} {us / 1000:.0f}" for name, us in per_package.most_common(8))
        total = sum(per_package.values()) / 1000
        print(f"  {label}: {modules} modules, {total:.0f} ms; top (ms): {top}")


if __name__ == "__main__":
    main()
