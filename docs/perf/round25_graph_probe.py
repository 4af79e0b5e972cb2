"""Probe (round 17): is a model step launch-bound? Per model, batch 32, random init on one GPU:
eager step as the runner makes it (predict + .cpu()), the CPU time to launch a forward, and a CUDA graph's replay;
then the same with a pure-Python thread holding the GIL beside (what decoding / builds do in a run).
Outputs of the graph are compared bitwise with the eager outputs on the same input."""
import json, sys, threading, time, warnings
import torch, yaml
import xbench

warnings.simplefilter("ignore")
dev = torch.device("cuda")
classes = yaml.safe_load(open("data_manifests/vindr_cxr.yaml"))["classes"]
prompts = [c.get("prompt", c["name"].lower()) for c in classes if c["name"] != "Edema"]
B = int(sys.argv[1]) if len(sys.argv) > 1 else 32
models = sys.argv[2].split(",") if len(sys.argv) > 2 else ["clip", "medklip", "kad", "mavl", "carzero", "devide"]
N = 20
real_cpu = torch.Tensor.cpu


class NoCopy:
    def __enter__(self):
        torch.Tensor.cpu = lambda self, *a, **k: self

    def __exit__(self, *exc):
        torch.Tensor.cpu = real_cpu


stop = threading.Event()


def spin():
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


def timed(fn, n=N):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t) / n


out = {}
for m in models:
    a = xbench.create_model(m, device=dev, random_init=True)
    for mod in a.__dict__.values():
        if isinstance(mod, torch.nn.Module):
            mod.eval()
    S = a.input_size
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(B, 3, S, S, device=dev, generator=g)
    r = {}
    with torch.inference_mode():
        eager = lambda: a.predict(x, prompts)
        ref = eager()
        r["eager_ms"] = timed(eager)
        with NoCopy():
            for _ in range(3):
                a.predict(x, prompts)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(N):
                a.predict(x, prompts)
            r["launch_ms"] = 1000 * (time.perf_counter() - t) / N
            torch.cuda.synchronize()
            r["launch_plus_drain_ms"] = 1000 * (time.perf_counter() - t) / N
        try:
            static = x.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), NoCopy():
                for _ in range(3):
                    a.predict(static, prompts)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with NoCopy(), torch.cuda.graph(graph):
                got = a.predict(static, prompts)

            def replay():
                static.copy_(x)
                graph.replay()
                return got.scores.cpu(), got.maps.cpu()
            sc, mp = replay()
            r["graph_equal"] = bool(torch.equal(sc, ref.scores) and torch.equal(mp, ref.maps))
            r["graph_max_diff"] = float(max((sc - ref.scores).abs().max(), (mp - ref.maps).abs().max()))
            r["graph_ms"] = timed(replay)
        except Exception as e:  # noqa: BLE001
            r["graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            graph = None
        th = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
        stop.clear()
        [t.start() for t in th]
        r["eager_ms_gil"] = timed(eager)
        if graph is not None:
            r["graph_ms_gil"] = timed(replay)
        stop.set()
        [t.join() for t in th]
    r = {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
    print(m, B, json.dumps(r), flush=True)
    out[m] = r
    del a
    torch.cuda.empty_cache()
tot = {k: round(sum(v.get(k, 0) for v in out.values()), 1) for k in ["eager_ms", "launch_ms", "launch_plus_drain_ms", "graph_ms", "eager_ms_gil", "graph_ms_gil"]}
print("sum", json.dumps(tot), "passes/s eager", round(len(out) * B * 1000 / tot["eager_ms"]), "graph", round(len(out) * B * 1000 / max(tot["graph_ms"], 1e-9)))
