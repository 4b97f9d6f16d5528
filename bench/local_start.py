"""How long ``chorus local`` (the README's first command) takes, and where.

What is measured
----------------
``chorus local`` is run ``--runs`` times from the repository root, each time
with a fresh state directory (``CHORUS_STATE_DIR``, so a new SQLite file
and a new redis dump), exactly as a user runs it after install. Its output
lines are timestamped as they arrive here, which splits a run into:

- **start**: launch → the ``turn.started`` line (the CLI imported, the
  embedded Redis up, the schema migrated, the workers spawned, the example
  module loaded and the job submitted);
- **first model request**: ``turn.started`` → the first ``llm.requested``
  line (a worker ready, its model client loaded, the first step taken);
- **run**: → the ``turn.completed`` line (the example's two model steps,
  its chord of three lookups and its barrier);
- **end**: → the process's exit (the workers and Redis stopped).

The table shows each run, then the median of each phase with the total
beside the 10 s target, and the CPU seconds the command and every process
it waited for used (``RUSAGE_CHILDREN``: the workers and redis-server
included), with the 1-min load average, since these machines are shared.

``--cold`` removes the repository's own ``__pycache__`` directories
(``orchestrator``, ``schemas``, ``workers``, ``examples``) before every
run: the state of a fresh checkout whose first command after
``pip install -e`` compiles them. (pip compiles the installed packages'
bytecode itself; the file cache is left as it is.)

Run it with the venv's Python: ``.venv/bin/python bench/local_start.py
--runs 5`` (``--chorus`` names another ``chorus`` executable).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 10.0
PACKAGES = ("orchestrator", "schemas", "workers", "examples")
#: (phase, the output line that ends it); "exit" is the process's exit.
PHASES = (
    ("start", "turn.started"),
    ("first model request", "llm.requested"),
    ("run", "turn.completed"),
    ("end", "exit"),
)


@dataclass
class Run:
    seconds: dict[str, float]
    total: float
    cpu: float
    load: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _drop_bytecode() -> None:
    for package in PACKAGES:
        for cache in (REPO / package).rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)


def _marks(lines: list[tuple[float, str]], total: float) -> dict[str, float]:
    """When each phase's closing line was first seen (seconds from launch)."""
    seen: dict[str, float] = {"exit": total}
    for at, line in lines:
        words = line.split()
        for _, mark in PHASES:
            if mark in words and mark not in seen:
                seen[mark] = at
    missing = [mark for _, mark in PHASES if mark not in seen]
    if missing:
        raise SystemExit(f"chorus local printed no {', '.join(missing)} line")
    return seen


def run_once(chorus: str, cold: bool, verbose: bool) -> Run:
    if cold:
        _drop_bytecode()
    with tempfile.TemporaryDirectory(prefix="chorus-local-bench-") as state:
        env = {**os.environ, "CHORUS_STATE_DIR": state}
        cpu0 = _children_cpu()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [chorus, "local"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        lines = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stdout]
        code = proc.wait()
        total = time.monotonic() - t0
        cpu = _children_cpu() - cpu0
    if verbose:
        for at, line in lines:
            print(f"  {at:7.3f} {line}")
    if code != 0 or not any(line.startswith("completed job") for _, line in lines):
        output = "\n".join(line for _, line in lines[-30:])
        raise SystemExit(f"chorus local failed (exit {code}):\n{output}")
    marks = _marks(lines, total)
    seconds: dict[str, float] = {}
    last = 0.0
    for phase, mark in PHASES:
        seconds[phase] = marks[mark] - last
        last = marks[mark]
    return Run(seconds, total, cpu, os.getloadavg()[0])


def _row(label: str, seconds: dict[str, float], total: float, cpu: float, load: str) -> str:
    cells = "".join(f"{seconds[phase]:>21.2f}" for phase, _ in PHASES)
    return f"{label:<8}{cells}{total:>9.2f}{cpu:>9.2f}{load:>7}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="drop the repo's bytecode each run")
    parser.add_argument("--chorus", default=str(Path(sys.executable).with_name("chorus")))
    parser.add_argument("--verbose", action="store_true", help="print every run's output")
    args = parser.parse_args()

    header = "".join(f"{phase:>21}" for phase, _ in PHASES)
    print(f"chorus local, {'cold' if args.cold else 'warm'} (seconds)")
    print(f"{'run':<8}{header}{'total':>9}{'cpu-s':>9}{'load':>7}")
    runs: list[Run] = []
    for i in range(1, args.runs + 1):
        run = run_once(args.chorus, args.cold, args.verbose)
        runs.append(run)
        print(_row(str(i), run.seconds, run.total, run.cpu, f"{run.load:.1f}"), flush=True)
    median = {phase: statistics.median(r.seconds[phase] for r in runs) for phase, _ in PHASES}
    total = statistics.median(r.total for r in runs)
    cpu = statistics.median(r.cpu for r in runs)
    print(_row("median", median, total, cpu, ""))
    verdict = "met" if total < TARGET_SECONDS else "NOT met"
    target = f"target < {TARGET_SECONDS:.0f} s {verdict}"
    print(f"\ntotal {total:.2f} s (median of {len(runs)}); {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
