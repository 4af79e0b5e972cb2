import sys, time, statistics
from xbench.models.checkpoint import read_checkpoint
files = ["/tmp/w/clip/open_clip_pytorch_model.bin", "/tmp/w/devide/devide.pt", "/tmp/w/carzero/CARZero_best_model.ckpt", "/tmp/w/medklip/checkpoint_final.pth"]
for f in files: read_checkpoint(f)  # page cache warm
t = []
for _ in range(3):
    s = time.perf_counter()
    for f in files: read_checkpoint(f)
    t.append(time.perf_counter() - s)
print(sys.argv[1], [round(x, 2) for x in t], "median", round(statistics.median(t), 2))
