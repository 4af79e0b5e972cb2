# Round 15 (issue 22): when a fresh CPU run's networks are ready, builds started after the feed's calibration (old,
# 8442b34) or while it calibrates (new, 3289894); each arm run from inside its own tree, cold cache, no evaluation.
# usage: XBENCH_MANIFESTS=<stand-ins>/manifests bash round23_build_start_cpu.sh <new tree> <old tree> <config> (the config of round23_startup_trace.py)
set -u
NEW=$1; OLD=$2; CFG=$3
for arm in new old new old; do
  T=$NEW; [ $arm = old ] && T=$OLD
  OUT=$(python3 -c "import yaml,sys; c=yaml.safe_load(open('$CFG')); print(c['output_dir'], c['cache_dir'])")
  rm -rf $OUT
  S=$(date +%s.%N)
  (cd $T && PYTHONPATH=$T HF_HUB_OFFLINE=1 PYTHONWARNINGS=ignore /work/main/.venv/bin/python -m xbench.cli run --config $CFG --quiet --no-eval > /dev/null 2>/tmp/round23_build_start_$arm.err) || tail -3 /tmp/round23_build_start_$arm.err
  E=$(date +%s.%N)
  python3 - "$arm" "$(echo "$E - $S" | bc)" "$(echo $OUT | cut -d' ' -f1)" <<'P'
import json, sys
arm, wall, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
log = json.load(open(f"{out}/run_log.json"))
first = log[0]["dataset"]
ready = {e["model"]: e["built_since_start_seconds"] for e in log if e["dataset"] == first}
twinned = {m: t for m, t in ready.items() if m != "center_prior"}
print(f"{arm}: process {wall:.2f} s; first network ready {min(twinned.values()):.2f} s, last {max(twinned.values()):.2f} s;"
      f" first dataset ({first}) done {log[0]['since_start_seconds']:.2f} s; run done {log[-1]['since_start_seconds']:.2f} s")
P
done
