# round 17, call B (one H200): GPU tests (graph replays = eager bytes for the seven networks; parity suites on CUDA), then 0.5 scale cold+warm, graphs on/off/on, same tree
set -u
END=545
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
nvidia-smi -L; nproc; grep -m1 "model name" /proc/cpuinfo; git log --oneline | head -1; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
(timeout 280 python3 benchmarks/bench_gpu.py --root /tmp/s0.5 --out /tmp/sgen --phases none --scale 0.5 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200; echo "gen $(( $(date +%s) - T0 ))s") &
XBENCH_TEST_DEVICE=cuda timeout 250 python3 -m pytest -q tests/test_graphs.py tests/models/test_parity_medklip.py tests/models/test_parity_mavl.py tests/models/test_parity_kad.py tests/models/test_parity_carzero.py tests/models/test_devide.py tests/models/test_clip.py -p no:cacheprovider 2>&1 | tail -5; echo "gputest $(( $(date +%s) - T0 ))s"
wait
for a in "a true" "b false" "c true" "d false"; do set -- $a; L=$(left); if [ $L -gt 130 ]; then bash .device_carry/exp/r17arm.sh $1 $2 0.5 $(( L - 3 )); else echo "no time for $1 ($L s)"; fi; done
for x in b c d; do [ -d /tmp/$x/default ] && python3 .device_carry/exp/cmp.py /tmp/a/default /tmp/$x/default | cut -c1-300; done
[ -d /tmp/b/cached ] && python3 .device_carry/exp/cmp.py /tmp/a/cached /tmp/b/cached | cut -c1-300
tar czf $OUT/r17b_run_logs.tgz -C /tmp logs; echo "done $(( $(date +%s) - T0 ))s"
