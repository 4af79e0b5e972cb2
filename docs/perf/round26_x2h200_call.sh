# round 18, call B (2 x H200): the GPU tests of round 17's code, then old (44ecde1) and new (HEAD) once more on one GPU of the host (0.5 scale, cold+warm), then new on 1 and 2 GPUs (multi phase)
set -u
END=578
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; git log --oneline | head -1; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
(timeout 280 python3 benchmarks/bench_gpu.py --root /tmp/s0.5 --out /tmp/sgen --phases none --scale 0.5 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s") &
CUDA_VISIBLE_DEVICES=0 XBENCH_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q tests/test_gpu_preprocess.py tests/test_decode_ahead.py -k "host_data or stream" -p no:cacheprovider -rA 2>&1 | grep -E "PASS|FAIL|SKIP|ERROR|passed|failed" | cut -c1-200
wait
for a in "d old" "e new"; do set -- $a; L=$(left); if [ $L -gt 130 ]; then CUDA_VISIBLE_DEVICES=0 bash docs/perf/round26_arm.sh $1 $2 0.5 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
L=$(left); if [ $L -gt 150 ]; then bash docs/perf/round26_multi_arm.sh m new 1,2 0.5 $(( L - 3 )); else echo "no time for multi ($L s)"; fi
python3 docs/perf/round12_cmp_stores.py /tmp/d/default /tmp/e/default | cut -c1-300
tar czf $OUT/r18b_run_logs.tgz -C /tmp logs; echo "done $(( $(date +%s) - T0 ))s"
