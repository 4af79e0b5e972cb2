# round 18, call A (one H200, prepared in round 17): the three waits removed (new, HEAD) against 44ecde1 (old), and graphs on top (graphs), 0.5 scale cold+warm
set -u
END=575
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; git log --oneline | head -1; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
(timeout 280 python3 benchmarks/bench_gpu.py --root /tmp/s0.5 --out /tmp/sgen --phases none --scale 0.5 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s") &
XBENCH_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q tests/test_gpu_preprocess.py -k host_data tests/test_decode_ahead.py -k "stream" -p no:cacheprovider 2>&1 | tail -2
timeout 100 python3 docs/perf/round26_stage_stalls.py 30 2>&1 | tail -10
wait
for a in "a new" "b old" "c graphs" "d new"; do set -- $a; L=$(left); if [ $L -gt 130 ]; then bash docs/perf/round26_arm.sh $1 $2 0.5 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
for x in b c d; do [ -d /tmp/$x/default ] && python3 docs/perf/round12_cmp_stores.py /tmp/a/default /tmp/$x/default | cut -c1-300; done
tar czf $OUT/r18a_run_logs.tgz -C /tmp logs; echo "done $(( $(date +%s) - T0 ))s"
