import mmap, os, time, ctypes, numpy as np, torch, multiprocessing as mp
torch.cuda.init(); dev = torch.device("cuda")
for gb in (0.5, 2.0):
    size = int(gb * (1 << 30))
    t = time.perf_counter(); m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED); arr = np.frombuffer(m, dtype=np.uint8)
    ptr = arr.ctypes.data; t1 = time.perf_counter()
    rc = torch.cuda.cudart().cudaHostRegister(ptr, size, 0); t2 = time.perf_counter()
    print(f"{gb} GB mmap {t1-t:.3f}s register rc={rc} {t2-t1:.3f}s", flush=True)
    host = torch.from_numpy(arr)
    ctx = mp.get_context("fork")
    def child(off):
        a = np.frombuffer(m, dtype=np.uint8)
        a[off:off + 1000] = 7
    p = ctx.Process(target=child, args=(1 << 20,)); p.start(); p.join()
    print("child wrote", int(host[(1 << 20):(1 << 20) + 1000].sum()), "exit", p.exitcode)
    # upload speed from the registered block vs a pageable copy
    n = 18 << 20
    x = host[:n]
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): y = x.to(dev, non_blocking=True)
    torch.cuda.synchronize(); print(f"upload registered {20*n/(time.perf_counter()-t)/1e9:.1f} GB/s")
    z = torch.from_numpy(np.ones(n, np.uint8))
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20): y = z.to(dev, non_blocking=True)
    torch.cuda.synchronize(); print(f"upload pageable {20*n/(time.perf_counter()-t)/1e9:.1f} GB/s")
    # the current path: an 18 MB shm-shared tensor received, stacked into pinned
    t = time.perf_counter()
    for _ in range(20):
        s = torch.ones(n // 2, dtype=torch.int16); s.share_memory_()
    print(f"share_memory_ 18MB {(time.perf_counter()-t)/20*1e3:.2f} ms each")
    t = time.perf_counter()
    for _ in range(20):
        h = torch.empty((1, n // 2), dtype=torch.int16, pin_memory=True); torch.stack([s], out=h)
    print(f"pinned alloc+stack 18MB {(time.perf_counter()-t)/20*1e3:.2f} ms each")
    torch.cuda.cudart().cudaHostUnregister(ptr)
