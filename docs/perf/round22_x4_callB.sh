# As run on the device (round 14). .device_carry/exp/r13m.sh = docs/perf/round21_x4_arm.sh, r14m.sh = round22_x2_arm.sh, cmp.py = round12_cmp_stores.py.
# round 14, call B (same warm 4-GPU host): 7e9ab1e (old) on 4 GPUs, this code on 2 GPUs (and 4 if call A had no time), then tables and stores compared
set -u
END=575; T0=$(date +%s)
left() { echo $(( END - ($(date +%s) - T0) )); }
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PATH=/tmp/site/bin:$PATH
[ -d /tmp/n4/multi_4 ] || bash .device_carry/exp/r13m.sh n4 new 4 1.0 $(( $(left) - 250 ))
bash .device_carry/exp/r13m.sh o4 old 4 1.0 $(( $(left) - 130 ))
L=$(left); [ $L -gt 100 ] && bash .device_carry/exp/r13m.sh n2 new 2 1.0 $(( L - 8 ))
for t in n4/multi_4 o4/multi_4 n2/multi_2; do [ -d /tmp/$t ] && python3 .device_carry/exp/cmp.py /tmp/n1/multi_1 /tmp/$t | cut -c1-400; done
sha256sum /tmp/n1/multi_1/tables/*.csv /tmp/n1/multi_1/tables/*.json /tmp/n4/multi_4/tables/*.csv /tmp/n4/multi_4/tables/*.json /tmp/o4/multi_4/tables/*.csv /tmp/o4/multi_4/tables/*.json /tmp/n2/multi_2/tables/*.csv /tmp/n2/multi_2/tables/*.json 2>/dev/null | sed 's#/tmp/##' > $OUT/tables.sha
python3 - <<'P'
import collections, os
seen = collections.defaultdict(set)
for line in open(os.environ["OUT"] + "/tables.sha"):
    h, p = line.split(); seen[p.split("/", 2)[2]].add(h)
print("tables with one sha256 across runs:", sum(len(v) == 1 for v in seen.values()), "of", len(seen), [k for k, v in seen.items() if len(v) > 1])
P
echo "done $(( $(date +%s) - T0 ))s"
