# Verified decode cache (sealed entries and records, identity with ctime/inode): warm whole run, new against old, on
# one GPU. Arms alternate new, old, new, old while time is left; each arm is cold (writes its own cache) then warm
# (bench_gpu.py's `cached` phase: the default run again from the warm cache) — docs/perf/round26_arm.sh, unchanged.
# Before the call, put the old tree (main before the change) beside the checkout:
#   git -C <repo> worktree add .device_carry/old <old commit>      (or: git archive <old commit> | tar -x -C .device_carry/old)
# and carry .device_carry (wheels as in round 26). Usage on the device: SCALE=0.5 bash docs/perf/cache_verify_call.sh
set -u
S=${SCALE:-0.5}; END=${END:-575}
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; git log --oneline | head -1; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
timeout 280 python3 benchmarks/bench_gpu.py --root /tmp/s$S --out /tmp/sgen --phases none --scale $S --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
for a in "a new" "b old" "c new" "d old"; do set -- $a; L=$(left); if [ $L -gt 130 ]; then bash docs/perf/round26_arm.sh $1 $2 $S $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
python3 - <<'P'
import json, os
out = os.environ["OUT"]
rows = {}
for tag, code in (("a", "new"), ("b", "old"), ("c", "new"), ("d", "old")):
    try:
        d = json.load(open(f"{out}/{tag}.json"))
    except OSError:
        continue
    rows.setdefault(code, []).append(d.get("cached", {}).get("whole_seconds"))
print("warm whole_seconds", rows)
new, old = [x for x in rows.get("new", []) if x], [x for x in rows.get("old", []) if x]
if new and old:
    print(f"warm: new {sum(new) / len(new):.2f} s, old {sum(old) / len(old):.2f} s, "
          f"new/old {sum(new) / len(new) / (sum(old) / len(old)):.3f} (within 5 %: {sum(new) / len(new) <= 1.05 * sum(old) / len(old)})")
P
for x in b c d; do [ -d /tmp/$x/default ] && python3 docs/perf/round12_cmp_stores.py /tmp/a/default /tmp/$x/default | cut -c1-300; done
echo "done $(( $(date +%s) - T0 ))s"
