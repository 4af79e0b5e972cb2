# /tmp/arm_old: git archive of f8e0ab0 (xbench, benchmarks), the code before the SHA-256 content key; stand-ins: bench_gpu.py --root /tmp/sd --phases none --scale 0.02 --gen-workers 2 --weights random --device cpu
cd /work/main
for n in o1 n1 o2 n2; do
  case ${n:0:1} in o) D=/tmp/arm_old;; n) D=/work/main;; esac
  rm -rf /tmp/sdc_$n
  PYTHONPATH=$D HF_HUB_OFFLINE=1 .venv/bin/python $D/benchmarks/bench_decode.py --root /tmp/sd --workers 2 --device torch-cpu --cache-dir /tmp/sdc_$n > /tmp/hash_$n.log 2>&1
  tail -1 /tmp/hash_$n.log > /tmp/hash_$n.json
done
echo done
