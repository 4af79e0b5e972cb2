"""Summarise a `py-spy record --format raw --threads --idle` profile: seconds per thread, the main thread's inclusive
seconds per function, and who calls the text encoders. Usage: python round19_profile_summary.py PROFILE.txt.gz RATE"""
import collections
import gzip
import sys

path, rate = sys.argv[1], float(sys.argv[2])
per_thread, inclusive, callers = collections.Counter(), collections.Counter(), collections.Counter()
targets = ("BertModel.forward", "KADTextEncoder.forward", "DeViDeAdapter.encode_text_ids",
           "EntityQueryAdapter.encode_text_ids")
with gzip.open(path, "rt") as f:
    for line in f:
        stack, n = line.rstrip().rsplit(" ", 1)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]
        per_thread[thread] += int(n)
        if thread != "MainThread":
            continue
        names = [fr.split(" (")[0] for fr in frames[1:]]
        for name in set(names):
            inclusive[name] += int(n)
        for target in targets:
            if target in names:
                i = names.index(target)
                callers[(target, " < ".join(reversed(names[max(0, i - 3):i])))] += int(n)
print("seconds sampled per thread (idle included)")
for thread, n in per_thread.most_common(8):
    print(f"  {n / rate:7.1f}  {thread}")
print("main thread, inclusive seconds (top 40)")
for name, n in inclusive.most_common(40):
    print(f"  {n / rate:7.1f}  {name}")
print("text encoders on the main thread, by caller")
for (target, chain), n in callers.most_common(10):
    print(f"  {n / rate:7.1f}  {target} <- {chain}")
