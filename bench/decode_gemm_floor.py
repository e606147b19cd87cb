"""Where a decode-sized FP8 GEMM's time goes: the shipped kernel (model/kernels/fp8_gemm.py,
6 rows of x) against kernels with its grid that do less. Small weights take 12-17 us there,
10-25x the time their bytes take at the HBM rate (fifth session), and no split of K helped:
  - empty: the programs start and end (the launch and scheduling floor of that grid);
  - read: each program reads its weight bytes as the shipped one does, and nothing else;
  - read + decode: also decodes the codes to bf16 (no dots, no sums of the parts);
  - shipped, and with faithful mode's input (bf16 on the FP8 grid: one part, no split).
Each in a CUDA graph over weights that rotate through copies bigger than the L2, so every
call reads HBM, next to the weight's bytes at the measured 4.2 TB/s. The differences say
which stage a faster kernel must cut. H200, 2026-12-01 (seventh session): reading and decoding
took 3.7-15.8 us, the shipped kernel 17.3-38.8 us; its split-K tail (the last program adding the
parts one load at a time) was most of the gap at 20-40 splits: reading 8 parts at once
(fp8_gemm._sum_group) cut wkv from 17.3 to 11.6 us and wq_a from 17.3 to 14.8. The rest is the
dots (twelve dependent MMAs per K step in exact mode: 4 code places times 3 parts).

--switch MODULE.ATTR V1 V2 .. times the shipped kernel once per value of a module switch
(alternated in one process), e.g. fp8_gemm.NARROW_ROWS 0 8; --rows sets the activation rows.

    python bench/decode_gemm_floor.py [--rows 6] [--switch dsflash.model.kernels.fp8_gemm.NARROW_ROWS 0 8]
"""
import argparse
import math
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from dsflash.model.kernels import fp8_gemm as gemm  # noqa: E402
from dsflash.model.kernels.common import e4m3_words, word_scales  # noqa: E402
from dsflash.model.kernels.quantize import fp8_grid_bf16  # noqa: E402


@triton.jit
def _floor_kernel(w_ptr, s_ptr, out_ptr, N, K, K_PER_SPLIT, swn, ssn, STAGE: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (N tile, K split), as _skinny_kernel lays them out. STAGE 0: nothing; 1: read
    the weight words and scales; 2: read and decode them. One value per program is stored,
    so that the reads are not optimized away."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if STAGE == 0:
        tl.store(out_ptr + pid_n * tl.num_programs(1) + pid_k, 0.0)
        return
    wn = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 4), tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, tl.minimum(k_start + K_PER_SPLIT, K), BLOCK_K):
        c = k0 // 4 + tl.arange(0, BLOCK_K // 4)
        sk = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        words = tl.load(w_ptr + wn[:, None] * swn + c[None, :])
        sbyte = tl.load(s_ptr + (wn // 32)[:, None] * ssn + sk[None, :])
        scales = word_scales(sbyte, True, True)
        exps = tl.reshape(tl.broadcast_to(scales[:, :, None], (BLOCK_N, BLOCK_K // 32, 8)), (BLOCK_N, BLOCK_K // 4))
        if STAGE == 1:
            acc += (words ^ exps).to(tl.float32)
        else:
            w = e4m3_words(words, exps, True, True)
            acc += w[0].to(tl.float32) + w[1].to(tl.float32) + w[2].to(tl.float32) + w[3].to(tl.float32)
    tl.store(out_ptr + pid_n * tl.num_programs(1) + pid_k, tl.sum(tl.sum(acc, axis=1), axis=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6, help="activation rows (a batch-1 verify block: 6)")
    parser.add_argument("--switch", nargs="+", metavar="MODULE.ATTR V",
                        help="a module switch and the values to time the shipped kernel at")
    parser.add_argument("--weights", default="wkv,wq_a,shared_w2,shared_w1,wq_b,wo_b,main_proj")
    args = parser.parse_args()
    switch = h200.module_switch(args.switch[0], args.switch[1:]) if args.switch else None
    dev = "cuda"
    for name in args.weights.split(","):
        n, k = h200.DECODE_GEMMS[name]
        nbytes = n * k + (n // 32) * (k // 32)
        copies = max(2, math.ceil(320e6 / nbytes))
        codes = [torch.randint(0, 0x77, (n, k), dtype=torch.uint8, device=dev) for _ in range(copies)]
        scales = [torch.full((n // 32, k // 32), 120, dtype=torch.uint8, device=dev) for _ in range(copies)]
        tiles = gemm._skinny_tiles(n, args.rows)
        out_tiles = triton.cdiv(n, tiles["BLOCK_N"])
        splits, per_split = gemm._split_k(k, tiles["BLOCK_K"], out_tiles, torch.device(dev), nbytes)
        out = torch.empty(out_tiles * splits, device=dev)
        x = torch.randn(args.rows, k, device=dev)
        line = []
        for stage, label in ((0, "empty"), (1, "read"), (2, "read + decode")):
            def run(i, stage=stage):
                words = codes[i].view(torch.int32)
                _floor_kernel[(out_tiles, splits)](words, scales[i], out, n, k, per_split, words.stride(0),
                                                   scales[i].stride(0), STAGE=stage,
                                                   BLOCK_N=tiles["BLOCK_N"], BLOCK_K=tiles["BLOCK_K"],
                                                   num_warps=tiles["num_warps"], num_stages=tiles["num_stages"])
            line.append(f"{label} {h200.rotating_graph_time(run, copies) * 1e6:.1f} us")
        on_grid = fp8_grid_bf16(x)  # faithful mode's input: one bf16 part, no split
        for round_ in range(2 if switch else 1):
            for value in switch[2] if switch else [None]:
                label = "" if switch is None else f" {switch[1]}={value}"
                if switch:
                    setattr(switch[0], switch[1], value)
                for inputs, kind in ((x, "shipped"), (on_grid, "faithful input")):
                    t = h200.rotating_graph_time(lambda i, x=inputs: gemm.fp8_gemm(x, codes[i], scales[i], small=True),
                                                 copies)
                    line.append(f"{kind}{label} {t * 1e6:.1f} us")
        print(f"[gemm floor] {name} [{n}, {k}], grid {out_tiles} x {splits}: " + " | ".join(line)
              + f" || bytes {nbytes / h200.HBM_BPS * 1e6:.1f} us", flush=True)
        codes = scales = None  # frees the copies (not del: the lambdas name them)


if __name__ == "__main__":
    main()
