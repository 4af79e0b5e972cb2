# As run on the device (round 11). There .device_carry/exp/r11arm.sh = round19_h100_arm.sh, .device_carry/exp/cmp.py = round12_cmp_stores.py,
# .device_carry/old = git archive d369478 xbench benchmarks, .device_carry/wheels = the wheels named in docs/performance.md.
for a in "n_cold new default" "n_warm1 new cached" "o_warm1 old cached"; do bash .device_carry/exp/r11arm.sh $a; done
python3 .device_carry/exp/cmp.py /tmp/keep_n_warm1 /tmp/keep_o_warm1 | head -c 400; echo
python3 .device_carry/exp/cmp.py /tmp/keep_n_cold /tmp/keep_n_warm1 | head -c 400; echo
