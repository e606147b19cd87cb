"""What programmatic dependent launch (model/kernels/pdl.py) saves between decode kernels.

Chains of a decode step's kernels, each captured in one CUDA graph as a step runs them,
timed with pdl.ENABLED off and on, alternated in one process:
  - norms: RMSNorms of 6 rows x 5,120 one after another (a kernel of ~1 us: the gap is most
    of its time);
  - layers: each layer's dense FP8 GEMMs at 6 rows (the attention's wq_a + wkv, wq_b, wo_b,
    the shared expert's w1 + w3 and w2), each behind an RMSNorm, over layers whose weights
    (128 MB a layer) rotate through more than the 50 MB L2, next to their bytes at 4.2 TB/s.

    python bench/pdl_chain.py [--layers 8] [--norms 200] [--rounds 3]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp8_gemm, pdl  # noqa: E402
from dsflash.model.kernels.rms_norm import rms_norm  # noqa: E402

LAYER_WEIGHTS = {"wq_a+wkv": (1792, 5120), "wq_b": (32768, 1280), "wo_b": (5120, 8192),
                 "shared w1+w3": (4608, 5120), "shared w2": (5120, 2304)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--norms", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(6, 5120, device="cuda")
    norm_w = torch.randn(5120, device="cuda")
    layers = [{name: h200.random_fp8(n, k) for name, (n, k) in LAYER_WEIGHTS.items()} for _ in range(args.layers)]
    layer_bytes = sum(n * k for n, k in LAYER_WEIGHTS.values())
    inputs = {name: torch.randn(6, k, device="cuda") for name, (_, k) in LAYER_WEIGHTS.items()}

    def norms():
        y = x
        for _ in range(args.norms):
            y = rms_norm(y, norm_w, 1e-6)

    def chain():
        for weights in layers:
            for name, (codes, scales) in weights.items():
                rms_norm(inputs[name], None, 1e-6)
                fp8_gemm.fp8_gemm(inputs[name], codes, scales, small=True)  # no host check in a capture

    fp8_gemm.tile_counts(x.device)
    for round_ in range(args.rounds):
        for enabled in (False, True):
            pdl.ENABLED = enabled
            per_norm = h200.graph_time(norms, iters=1) / args.norms
            per_layer = h200.graph_time(chain, iters=1) / args.layers
            print(f"[pdl_chain round{round_} ENABLED={enabled}] norm_us={per_norm * 1e6:.2f} "
                  f"layer_us={per_layer * 1e6:.1f} layer_bytes_us={layer_bytes / h200.HBM_BPS * 1e6:.1f} "
                  f"launches_per_layer={2 * len(LAYER_WEIGHTS)}", flush=True)


if __name__ == "__main__":
    main()
