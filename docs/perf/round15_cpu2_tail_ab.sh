B="--root /tmp/cpuab/data --phases default --scale 0.01 --size-div 4 --device cpu --models center_prior,ref_xattn,random_prior --bootstrap 1000 --workers 2 --batch-size 32"
for n in o1 n1 o2 n2; do
  if [ ${n:0:1} = o ]; then P=/tmp/old_de; else P=/work/main; fi
  HF_HUB_OFFLINE=1 PYTHONPATH=$P timeout 900 /work/main/.venv/bin/python $P/benchmarks/bench_gpu.py $B --out /tmp/cpuab/$n > /tmp/cpuab/$n.log 2>&1
  python3 -c "
import json; x=json.load(open('/tmp/cpuab/$n/bench_gpu.json'))['default']; print('$n', {k:x.get(k) for k in ['whole_seconds','infer_seconds','eval_seconds','image_model_passes']})"
done
python3 /work/main/.device_carry/exp/cmp.py /tmp/cpuab/o1/default /tmp/cpuab/n1/default | head -c 400; echo
diff <(cd /tmp/cpuab/o1/default/tables && find . -type f | sort | xargs md5sum) <(cd /tmp/cpuab/n1/default/tables && find . -type f | sort | xargs md5sum) && echo tables-identical
