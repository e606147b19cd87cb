"""Host time of one CUDA graph replay against the kernels it holds (does merging graphs save
host time, or does a replay cost per kernel node?), next to the GPU time of those kernels.

    python bench/graph_launch.py
"""
import time
import torch

x = torch.zeros(1024, device="cuda")
for nodes in (10, 50, 100, 200, 400, 800):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(nodes):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(nodes):
            x.add_(1.0)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    host = []
    for _ in range(20):
        torch.cuda.synchronize()
        t = time.perf_counter()
        g.replay()
        host.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(20):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    host.sort()
    print(f"[graph] {nodes} nodes: host {host[len(host) // 2] * 1e6:.1f} us a replay (median), "
          f"GPU {a.elapsed_time(b) / 20 * 1e3:.1f} us", flush=True)
