"""Round 27 (issue 22, round 19): the decode feed's transform keys and 8-bit tables, this tree's ``model_input``
against an earlier tree's (``cache.py`` given as a file), per model config, each on a fresh adapter object. The
kernel-path variant (the GPU plan's table as the candidate, computed on CPU tensors) is compared too.

usage: git show b8ece99:xbench/inference/cache.py > /tmp/old_cache.py
       python docs/perf/round27_keys_against_b8ece99.py /tmp/old_cache.py
"""
import sys
import warnings

import numpy as np

import xbench
from xbench.inference import cache as new
from xbench.inference.gpu_preprocess import code_table, plan_for
from xbench.models.base import input_twin

NAMES = ["clip", "medklip", "kad", "mavl", "carzero", "devide", "ref_xattn", "ref_patchsim", "center_prior",
         "random_prior", "kad_512"]


def fresh(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return input_twin(name) or xbench.create_model(name)


def main(old_source: str) -> None:
    old = type(sys)("xbench.inference.old_cache")
    old.__package__ = "xbench.inference"
    sys.modules[old.__name__] = old
    exec(compile(open(old_source).read(), old_source, "exec"), old.__dict__)
    differ = 0
    for name in NAMES:
        a, b, c = fresh(name), fresh(name), fresh(name)
        was, now = old.model_input(a), new.model_input(b)
        plan = plan_for(c)
        kernel = new.model_input(c, code_table(c, plan, "cpu") if plan is not None else None)
        luts = [s.lut for s in (was, now, kernel)]
        same = was.key == now.key == kernel.key and (all(t is None for t in luts)
                                                       or all(np.array_equal(luts[0], t) for t in luts[1:]))
        differ += not same
        print(f"{name:14s} before {was.key}  now {now.key}  kernel path {kernel.key}  {'same' if same else 'DIFFERENT'}")
    print(f"{len(NAMES)} configs, {differ} different")


if __name__ == "__main__":
    main(sys.argv[1])
