set -u
pip install -q --no-deps --target /tmp/site .device_carry/wheels/*.whl 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1
nvidia-smi -L; nproc; T0=$(date +%s)
python3 -c "import sys,torch,os;d=os.path.dirname(torch.__file__);print('dont_write_bytecode',sys.dont_write_bytecode,'torch',d,'writable',os.access(d,os.W_OK),'pyc',len(os.listdir(os.path.join(d,'__pycache__'))) if os.path.isdir(os.path.join(d,'__pycache__')) else 0)"; env | grep -i "^PYTHON" | cut -c1-120
python3 benchmarks/bench_gpu.py --root /tmp/data --out /tmp/gen --phases none --scale 0.25 --gen-workers 16 2>&1 | tail -1 | cut -c1-200
echo "gen $(( $(date +%s) - T0 ))s"
python3 .device_carry/exp/calib_micro.py 2>&1 | grep -v WARN | tee $OUT/calib_micro.json; echo "micro $(( $(date +%s) - T0 ))s"
B="--root /tmp/data --phases default --scale 0.25 --bootstrap 1000 --workers 16"
for k in 1 2; do
PYTHONPATH=/tmp/site:$PWD/.device_carry/old timeout 130 python3 .device_carry/old/benchmarks/bench_gpu.py $B --out /tmp/o$k > $OUT/o$k.log 2>&1; echo "old$k $(( $(date +%s) - T0 ))s"
timeout 130 python3 benchmarks/bench_gpu.py $B --out /tmp/n$k > $OUT/n$k.log 2>&1; echo "new$k $(( $(date +%s) - T0 ))s"
done
mkdir -p /tmp/r; for d in o1 n1 o2 n2; do cp /tmp/$d/bench_gpu.json /tmp/r/$d.json; cp /tmp/$d/default/run_log.json /tmp/r/runlog_$d.json; done
for p in "o1 n1" "o1 o2" "n1 n2"; do set -- $p; python3 .device_carry/exp/cmp.py /tmp/$1/default /tmp/$2/default > /tmp/r/cmp_$1_$2.json; head -c 260 /tmp/r/cmp_$1_$2.json; echo; done
tar czf $OUT/r.tgz -C /tmp r
python3 - <<'P'
import json
for f in ["o1","n1","o2","n2"]:
    try: d=json.load(open(f"/tmp/r/{f}.json"))
    except Exception as e: print(f, e); continue
    x=d.get("default",{}); print(f, {k:x.get(k) for k in ["whole_seconds","infer_seconds","eval_seconds","build_seconds","decode_seconds","passes_per_s","gpu_alone_passes_per_s"]}, d.get("errors"))
P
