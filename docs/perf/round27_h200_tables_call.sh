# round 19, call B (one H200): the 8-bit tables read off one call (the working tree, "new") against b8ece99 ("old"), 0.25 scale: cold a(new) b(old); warm in fresh processes w1(new) w2(old) w3(new) w4(old); cold c(new) d(old)
# (run as .device_carry/exp/r19b.sh with the arm at .device_carry/exp/r19arm.sh, kept here as docs/perf/round27_arm.sh; the old tree was `git archive b8ece99` in .device_carry/old)
set -u
END=540
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; git log --oneline | head -1; git diff --stat | tail -1; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/s0.25 --out /tmp/sgen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s"
for a in "a new cold" "b old cold" "w1 new warm" "w2 old warm" "w3 new warm" "w4 old warm" "c new cold" "d old cold"; do set -- $a; L=$(left); if [ $L -gt 55 ]; then bash docs/perf/round27_arm.sh $1 $2 0.25 $(( L - 3 )) $3; else echo "no time for $1 ($L s)"; fi; done
for x in b c d; do [ -d /tmp/$x/default ] && python3 docs/perf/round12_cmp_stores.py /tmp/a/default /tmp/$x/default | cut -c1-300; done
for x in w2 w3 w4; do [ -d /tmp/store_$x ] && diff -rq /tmp/store_w1 /tmp/store_$x | grep -v meta.json | head -3; echo "store w1 vs $x compared"; done
tar czf $OUT/r19b_results.tgz -C /tmp res logs; echo "done $(( $(date +%s) - T0 ))s"
