# As run on the device (round 14, one H200): bench_gpu's multi phase started from inside a folder holding 7e9ab1e's xbench; output below
# round 14, call E (one GPU): bench_gpu's multi phase (torchrun, 1 rank) started from inside the old tree's folder
# (which holds 7e9ab1e's xbench): the ranks must import the bench's tree (same_imports_env)
set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
unset PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX  # bytecode is written beside the sources: it shows which tree was imported
R=$PWD; T0=$(date +%s)
timeout 200 python3 benchmarks/bench_gpu.py --root /tmp/t --out /tmp/tgen --phases none --scale 0.02 --gen-workers 16 --weights files 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
find $R -name __pycache__ -path "*device_carry/old*" -exec rm -rf {} +; cd .device_carry/old && python3 -c "import xbench; print('a python -c here imports', xbench.__file__)"
timeout 240 python3 $R/benchmarks/bench_gpu.py --root /tmp/t --out /tmp/tm --scale 0.02 --bootstrap 20 --workers 8 --weights files --phases multi --gpus 1 > /tmp/tm.log 2>&1; echo "rc $?"
python3 - <<'P'
import json
d = json.load(open("/tmp/tm/bench_gpu.json")); m = d["multi_1"]
print("bench's xbench:", d["environment"]["xbench"], "| rank returncode", m["returncode"], "wall", m["wall_seconds"], m.get("stderr_tail", "")[-300:])
P
python3 -c "
import json; d=json.load(open('/tmp/tm/multi_1/evaluation_timing.json')); print('timing keys', sorted(d))"
ls /tmp/tm/multi_1/tables | head -3
echo "old tree modules compiled (imported) during the run:"; find $R/.device_carry/old/xbench -name "*.pyc" | sed "s#.*/old/##" | head
echo "new tree inference modules compiled:"; ls $R/xbench/inference/__pycache__ 2>/dev/null | head -3
echo "done $(( $(date +%s) - T0 ))s"
