"""The indexer top-k's warm-up (top_k.warm_up over indexer.top_k_rows of the bench preset)
timed on the Triton cache it is given, then the first calls at shapes a 64K-256K prompt and a
decode step meet; with --cold, the same first calls without the warm-up (each then pays its
compiles, as a prompt did mid-way before the warm-up covered every plan). Run each form in a
fresh process on an empty cache:

    TRITON_CACHE_DIR=$(mktemp -d) python bench/top_k_warm_up.py
    TRITON_CACHE_DIR=$(mktemp -d) python bench/top_k_warm_up.py --cold
"""
import sys
import time

import torch

from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig
from dsflash.model.kernels import top_k
from dsflash.model.layers.indexer import top_k_rows

# (rows, entries, k): a prefill slice of a ratio-2 index layer at 64K-128K tokens (3 chunks a
# row), the candidate blocks at 1M tokens (8), decode rows at 80K and 200K tokens
SHAPES = ((128, 49152, 512), (48, 131072, 2048), (6, 40001, 512), (6, 100001, 512))


def main() -> None:
    cold = "--cold" in sys.argv
    if not cold:
        began = time.perf_counter()
        top_k.warm_up(torch.device("cuda"), top_k_rows(ModelConfig.from_dict(preset_config("bench"))))
        torch.cuda.synchronize()
        print(f"[top_k warm-up] warm_up: {time.perf_counter() - began:.2f} s", flush=True)
    for n, N, k in SHAPES:
        x = torch.randn(n, N, device="cuda")
        torch.cuda.synchronize()
        began = time.perf_counter()
        got = top_k.top_k_ascending_kernel(x, k)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - began
        same = torch.equal(got, torch.topk(x, k, dim=1).indices.sort(dim=1).values)
        print(f"[top_k warm-up] {'cold' if cold else 'after the warm-up'}: first call {n} x {N}, k {k}: "
              f"{seconds:.3f} s, equal to torch.topk: {same}", flush=True)


if __name__ == "__main__":
    main()
