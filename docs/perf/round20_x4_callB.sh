# As run on the device (round 12). There .device_carry/exp/r12m.sh = round20_x4_arm.sh, .device_carry/exp/cmp.py = round12_cmp_stores.py,
# .device_carry/old = git archive 43f6b62 xbench benchmarks, .device_carry/wheels = the wheels named in docs/performance.md.
# round 12, call B (same host): old code with 4 GPUs, new code with 2 GPUs; stores and tables against new 1 GPU
set -u
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
bash .device_carry/exp/r12m.sh o4 old 4 200
bash .device_carry/exp/r12m.sh n2 new 2 200
for x in n14/multi_4 o4/multi_4 n2/multi_2; do python3 .device_carry/exp/cmp.py /tmp/n14/multi_1 /tmp/$x | head -c 300; echo; done
python3 - <<'P'
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks"); import bench_gpu
for x in ("n14/multi_4", "o4/multi_4", "n2/multi_2"):
    try: print(x, bench_gpu.tables_equal(Path("/tmp/n14/multi_1"), Path("/tmp/" + x), decimals=12))
    except Exception as e: print(x, e)
P
echo "done $(( $(date +%s) - T0 ))s"
