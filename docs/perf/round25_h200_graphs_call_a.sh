# round 17, call A (one H200): CUDA graphs of the networks' steps. GPU test of replays = eager bytes; then 0.25 scale cold+warm, graphs on/off/off/on, same tree
set -u
END=570
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
(timeout 240 python3 benchmarks/bench_gpu.py --root /tmp/s0.25 --out /tmp/sgen --phases none --scale 0.25 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s") &
XBENCH_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -x tests/test_graphs.py -p no:cacheprovider 2>&1 | tail -4; echo "gputest $(( $(date +%s) - T0 ))s"
wait
for a in "a true" "b false" "c false" "d true"; do set -- $a; L=$(left); if [ $L -gt 75 ]; then bash .device_carry/exp/r17arm.sh $1 $2 0.25 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
for x in b c d; do python3 .device_carry/exp/cmp.py /tmp/a/default /tmp/$x/default | cut -c1-400; done
python3 .device_carry/exp/cmp.py /tmp/a/default /tmp/a/cached | cut -c1-300
tar czf $OUT/r17a_run_logs.tgz -C /tmp logs; echo "done $(( $(date +%s) - T0 ))s"
