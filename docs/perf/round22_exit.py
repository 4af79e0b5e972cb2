"""Seconds between a run's last table and its process's end: `python -m xbench.cli` (console: live objects frozen
before exit) against the same command through `main` alone (the interpreter's final collection traverses them).

    PYTHONPATH=<tree> python docs/perf/round22_exit.py <output folder> [repeats]

Each arm runs `run --config xbench/configs/runs/phantom.yaml --overwrite --quiet` in a fresh process, alternated.
The end of the run is `paper_tables_written` in `<output>/evaluation_timing.json`; the process's end is when
`Popen.wait` returns (stdout and stderr go to files, so no pipe is waited for). Prints one JSON line per run.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ARMS = {"console": [sys.executable, "-m", "xbench.cli"],
        "main_only": [sys.executable, "-c", "import sys; from xbench.cli import main; sys.exit(main(sys.argv[1:]))"]}


def one(arm: str, out: Path) -> dict:
    args = ["run", "--config", "xbench/configs/runs/phantom.yaml", "--output-dir", str(out), "--overwrite", "--quiet"]
    with open(out.parent / f"{arm}.log", "w") as log:
        started = time.time()
        code = subprocess.Popen(ARMS[arm] + args, stdout=log, stderr=subprocess.STDOUT).wait()
        ended = time.time()
    timing = json.loads((out / "evaluation_timing.json").read_text())
    last = timing["created_unix"] + timing["events"]["run"]["paper_tables_written"]
    return {"arm": arm, "returncode": code, "wall_s": round(ended - started, 2), "exit_after_last_table_s": round(ended - last, 2)}


def main() -> None:
    out = Path(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for _ in range(repeats):
        for arm in ARMS:
            print(json.dumps(one(arm, out)), flush=True)


if __name__ == "__main__":
    main()
