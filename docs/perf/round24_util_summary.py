"""GPU utilisation of call B (round24_h200_util_call.sh): nvidia-smi's utilization.gpu sampled every 100 ms, in
2-s windows since the benchmark's start, and its mean over each phase (phase starts from the benchmark's log).

    python docs/perf/round24_util_summary.py docs/perf/round24_h200_quarter_util.csv docs/perf/round24_h200_quarter_util_t_start
"""
import collections
import csv
import datetime
import sys

t0 = float(open(sys.argv[2]).read())
samples = []
for row in csv.reader(open(sys.argv[1])):
    when = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
    samples.append((when.timestamp() - t0, int(row[1].split()[0])))
windows = collections.defaultdict(list)
for t, u in samples:
    windows[int(t // 2) * 2].append(u)
print("2-s windows (s: mean %):", " ".join(f"{k}:{sum(v) / len(v):.0f}" for k, v in sorted(windows.items())))
for name, start, end in (("default (cold)", 1.9, 53.6), ("cached (warm)", 53.6, samples[-1][0])):
    inside = [u for t, u in samples if start <= t < end]
    print(f"{name}: {len(inside)} samples from {start} s to {end:.1f} s, mean {sum(inside) / len(inside):.1f} %")
