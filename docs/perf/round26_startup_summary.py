"""Round 26 (issue 22, round 18): the main thread's first seconds in a cold run, from a py-spy speedscope profile.

py-spy (``record --rate 100 --idle --threads -f speedscope``) samples every thread at the same instants, so the
main thread's n-th sample is at n / 100 s of the process (profiled time: py-spy slows the run, see the call's
output). Each sample is put in the first matching phase below, by the frames on its stack; the script prints the
phases' seconds up to the first network step, and the dominant phase of each second.

usage: python docs/perf/round26_startup_summary.py startup.speedscope.json[.gz]
"""
import collections
import gzip
import json
import sys

PHASES = [  # (phase, test on the stack's frames "name@file:line"); the first that matches
    ("imports before the run", lambda fs: any(f.startswith("timed_run@") and f.endswith(":269") for f in fs)),
    ("run: input twins (imports, tokenizers)", lambda fs: any(f.startswith("input_twin@") for f in fs)),
    ("run: decode feed set-up (calibrations)", lambda fs: any(f.startswith("InputFeed.__init__@") for f in fs)),
    ("run: waiting for decoded inputs", lambda fs: any(f.startswith("InputFeed.batches@") for f in fs)
     and fs[-1].startswith("Condition.wait@")),
    ("run: centre prior step", lambda fs: any(f.startswith("CenterPrior.") for f in fs)),
    ("model step (a network)", lambda fs: any(f.startswith("Adapter.predict_cases@") for f in fs)),
    ("run: other", lambda fs: any(f.startswith("infer_run@") for f in fs)),
    ("benchmark phase, outside inference", lambda fs: any(f.startswith("timed_run@") for f in fs)),
    ("before the benchmark's phase", lambda fs: True),
]


def main(path: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    frames = [f"{f['name']}@{(f.get('file') or '').rsplit('/', 1)[-1]}:{f.get('line')}" for f in data["shared"]["frames"]]
    main_thread = max(data["profiles"], key=lambda p: len(p["samples"]))  # it lives longest
    rate = 1 / main_thread["weights"][0]
    phases = []
    for sample in main_thread["samples"]:
        fs = [frames[i] for i in sample]
        phases.append(next(name for name, test in PHASES if test(fs)))
    first_step = phases.index("model step (a network)")
    print(f"main thread: {len(phases)} samples at {rate:g} Hz; first network step at {first_step / rate:.2f} s")
    totals = collections.Counter(phases[:first_step])
    for name, _ in PHASES:
        if totals[name]:
            print(f"  up to it: {name:42s} {totals[name] / rate:6.2f} s")
    run_start = next(i for i, p in enumerate(phases) if p.startswith("run:"))
    print(f"  the run's first sample at {run_start / rate:.2f} s: {(first_step - run_start) / rate:.2f} s from the run's "
          "start to the first network step")
    width = int(rate)
    for w in range(0, min(len(phases), first_step + 3 * width), width):
        c = collections.Counter(phases[w:w + width]).most_common(2)
        print(f"  {w / rate:5.1f} s: " + ", ".join(f"{n} {k / rate:.2f} s" for n, k in c))


if __name__ == "__main__":
    main(sys.argv[1])
