# round 18, call D (one H200): background builds started before the decode feed's set-up (new, the working tree) against 82f54b8 (old), 0.25 scale, cold only, new old new old
set -u
END=430
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; git log --oneline | head -1; git diff --stat | tail -1; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/s0.25 --out /tmp/sgen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s"
for a in "a new" "b old" "c new" "d old"; do set -- $a; L=$(left); if [ $L -gt 60 ]; then bash docs/perf/round26_arm_cold.sh $1 $2 0.25 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
for x in b c d; do [ -d /tmp/$x/default ] && python3 docs/perf/round12_cmp_stores.py /tmp/a/default /tmp/$x/default | cut -c1-300; done
tar czf $OUT/r18d_run_logs.tgz -C /tmp logs; echo "done $(( $(date +%s) - T0 ))s"
