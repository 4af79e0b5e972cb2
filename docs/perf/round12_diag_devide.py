"""Is DeViDe's forward deterministic on the GPU, and what disturbs it? (issue 22, round 4 diagnosis)"""
import threading, time, json, sys, warnings
import torch
warnings.simplefilter("ignore")
from xbench.models import create_model
from xbench.inference.speed import precision_mode
dev = torch.device("cuda")
out = {}
models = {m: create_model(m, device=dev, random_init=True) for m in ("devide", "kad")}
g = torch.Generator().manual_seed(0)
x = torch.rand((128, 3, 224, 224), generator=g).to(dev)
prompts = ["pneumonia", "effusion", "cardiomegaly"]

def pred(m, mode="inference"):
    ctx = torch.inference_mode() if mode == "inference" else torch.no_grad()
    with ctx, precision_mode("fp32", dev):
        p = models[m].predict_cases(x, prompts, [str(i) for i in range(len(x))])
    return p.scores.clone(), p.maps.clone()

def same(a, b):
    return bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])), float((a[0] - b[0]).abs().max()), float((a[1] - b[1]).abs().max())

stop = threading.Event()
def busy():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.rand((8, 2048, 2048), device=dev, dtype=torch.float64)
        m = torch.rand((2048, 224), device=dev, dtype=torch.float64)
        while not stop.is_set():
            (a @ m).floor_()
            s.synchronize()

for m in models:
    base = pred(m)
    r = {"repeat": same(base, pred(m)), "no_grad": same(base, pred(m, "no_grad"))}
    t = threading.Thread(target=busy); t.start()
    r["concurrent_side_stream"] = [same(base, pred(m)) for _ in range(3)]
    stop.set(); t.join(); stop.clear()
    torch.backends.cudnn.allow_tf32 = True; torch.backends.cuda.matmul.allow_tf32 = True
    with torch.inference_mode():
        p = models[m].predict_cases(x, prompts, [str(i) for i in range(len(x))])
    r["tf32_on"] = same(base, (p.scores, p.maps))
    torch.backends.cudnn.allow_tf32 = True; torch.backends.cuda.matmul.allow_tf32 = False
    small = pred(m)  # after other work
    r["after"] = same(base, small)
    # batch composition: first 64 alone vs inside 128
    with torch.inference_mode(), precision_mode("fp32", dev):
        p64 = models[m].predict_cases(x[:64], prompts, [str(i) for i in range(64)])
    r["half_batch_equal_rows"] = same((base[0][:64], base[1][:64]), (p64.scores, p64.maps))
    out[m] = r
print(json.dumps(out, indent=1))
