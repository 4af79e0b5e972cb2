"""Round 27 (issue 22, round 19): which imports the main thread runs in a time window of a py-spy speedscope profile.

Each main-thread sample in [start, stop) seconds is attributed to the chain of ``<module>`` frames that begins with
the first module whose path starts with ``package`` (``depth`` modules of it), or to its last three frames when no
such module is on the stack.

usage: python docs/perf/round27_import_breakdown.py profile.speedscope.json.gz start stop package [depth]
"""
import collections
import gzip
import json
import sys


def main(path: str, start: float, stop: float, package: str, depth: int = 3) -> None:
    data = json.load(gzip.open(path, "rt"))
    frames = [(f["name"], f.get("file") or "") for f in data["shared"]["frames"]]
    main_thread = max(data["profiles"], key=lambda p: len(p["samples"]))
    seconds: collections.Counter = collections.Counter()
    t = 0.0
    for sample, weight in zip(main_thread["samples"], main_thread["weights"]):
        if start <= t < stop:
            modules = [file.split("site-packages/")[-1].split("/tmp/site/")[-1]
                       for name, file in (frames[i] for i in sample) if name == "<module>"]
            first = next((k for k, m in enumerate(modules) if m.startswith(package)), None)
            if first is not None:
                seconds[" > ".join(modules[first:first + depth])] += weight
            else:
                seconds["(other) " + " > ".join(f"{n}@{f.split('/')[-1]}" for n, f in (frames[j] for j in sample[-3:]))] += weight
        t += weight
    for chain, s in seconds.most_common(12):
        print(f"{s:6.2f} s  {chain[:200]}")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 3)
