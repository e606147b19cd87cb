"""What a faithful prefill chunk's attention queries cost in bytes: wq_b's product writes them in
fp32 ([n, 64, 512]: 2.1 GB at a 16K chunk) and the Gluon rows kernel reads them back, rotates
them and rounds them to bf16 as it reads them. This times both sides as shipped and with half
the bytes, the upper bound of what bf16 queries could save (their numbers are not the shipped
ones: rounding before RoPE changes the rotated channels' bits):
- wq_b's product on cuBLAS (torch._scaled_mm, 1 x 128 operand, 128 x 128 weight blocks) with
  fp32 output, with bf16 output, and split as a head's first three 128-row blocks in bf16 and
  its last (64 plain + 64 rotated channels) in fp32;
- the rows kernel (sparse_attention_gluon.prefill_attention_decoded, its shipped form, wo_a's
  operand out) reading fp32 queries before RoPE, and reading bf16 ones (rotated in fp32 as read).
Each next to the bytes it writes or reads at the measured HBM rate, and the product's FLOPs at
the FP8 rate.

    python bench/query_bytes.py [--queries 16384]
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
from rows_kernel_inputs import D, GROUPS as groups, HEADS as heads, rows_kernel_inputs  # noqa: E402
from dsflash.model.kernels import fp8_blockwise  # noqa: E402
from dsflash.model.kernels import sparse_attention_gluon as gluon_form  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--queries", type=int, default=16384)
args = parser.parse_args()
n, q_lora = args.queries, 1280
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)


def report(name: str, seconds: float, moved: float, flops: float = 0.0) -> None:
    line = (f"[query_bytes] {name}: {seconds * 1e6:.0f} us; {moved / 1e9:.2f} GB at {h200.HBM_BPS / 1e12:.1f} "
            f"TB/s {moved / h200.HBM_BPS * 1e6:.0f} us")
    if flops:
        line += (f"; {flops / 1e12:.2f} TFLOP at {h200.FP8_FLOPS / 1e12:.0f} TFLOP/s "
                 f"{flops / h200.FP8_FLOPS * 1e6:.0f} us")
    print(line, flush=True)


# wq_b: [n, q_lora] rows (faithful mode's FP8 grid) times [heads * D, q_lora]
x = torch.randn(n, q_lora, device=dev, generator=g)
codes, scales = fp8_blockwise.rows_1x128(x)
a_scales = fp8_blockwise.segment_scales(scales, q_lora // 128, 0, codes.shape[1])
w = torch.randint(0, 0x7E, (heads * D, q_lora), dtype=torch.uint8, device=dev, generator=g)  # no NaN codes
w |= torch.randint(0, 2, w.shape, dtype=torch.uint8, device=dev, generator=g) << 7
# scales laid out as the weights' encoding lays them out (rows padded: cuBLAS reads them so)
w_scales = fp8_blockwise.weight_scales_like(heads * D, q_lora, dev)
w_scales.copy_(torch.rand(heads * D // 128, q_lora // 128, device=dev, generator=g) / 64)
head_blocks = torch.arange(heads * D // 128, device=dev).view(heads, D // 128)
plain, tail = head_blocks[:, :3].flatten(), head_blocks[:, 3]


def rows_of(blocks: torch.Tensor) -> torch.Tensor:
    return (blocks[:, None] * 128 + torch.arange(128, device=dev)).flatten()


def padded(scales: torch.Tensor) -> torch.Tensor:
    out = fp8_blockwise.weight_scales_like(scales.shape[0] * 128, q_lora, dev)
    return out.copy_(scales)


w_plain, w_tail = w[rows_of(plain)].contiguous(), w[rows_of(tail)].contiguous()
s_plain, s_tail = padded(w_scales[plain]), padded(w_scales[tail])


def product(weight, weight_scales, dtype):
    operands = fp8_blockwise._operands(codes[0], a_scales, weight, weight_scales)
    return lambda: torch._scaled_mm(*operands, out_dtype=dtype)


flops = 2 * n * q_lora * heads * D
in_bytes = n * q_lora + heads * D * q_lora
full32 = product(w, w_scales, torch.float32)
full16 = product(w, w_scales, torch.bfloat16)
split = (product(w_plain, s_plain, torch.bfloat16), product(w_tail, s_tail, torch.float32))
same = (full32()[:, rows_of(plain)].bfloat16() == split[0]()).float().mean().item()
same32 = (full32()[:, rows_of(tail)] == split[1]()).float().mean().item()
rounded = (full32().bfloat16() == full16()).float().mean().item()
print(f"[query_bytes] bits: the split's bf16 part is the whole's fp32 output rounded (the shipped bits) at "
      f"{same:.4%} of entries, its fp32 part the whole's fp32 at {same32:.4%}; the whole's bf16 output is its fp32 "
      f"one rounded at {rounded:.4%}")
for round_ in range(2):
    report(f"round {round_} wq_b fp32 out", h200.cuda_time(full32, iters=20), in_bytes + n * heads * D * 4, flops)
    report(f"round {round_} wq_b bf16 out", h200.cuda_time(full16, iters=20), in_bytes + n * heads * D * 2, flops)
    report(f"round {round_} wq_b split", h200.cuda_time(lambda: [f() for f in split], iters=20),
           in_bytes + n * heads * (384 * 2 + 128 * 4), flops)

# the rows kernel, as bench/rows_kernel_ablation.py sets it up (a prompt's locality)
inputs = rows_kernel_inputs(n, dev)
raw, raw16, (window_rows, entry_rows) = inputs.raw, inputs.raw.bfloat16(), inputs.local
out = fp8_blockwise.empty_operand(n, heads * D, groups, raw.device)
arguments, constants = gluon_form.launch_arguments(raw, inputs.window_keys, window_rows, inputs.entry_keys, entry_rows,
                                                   inputs.sink, D ** -0.5, out, (inputs.cos, inputs.sin))
tiles = gluon_form.row_tiles(window_rows, entry_rows)


def rows_kernel(q):
    return lambda: gluon_form.launch_rows([q] + arguments[1:], constants, tiles)


operand_bytes = n * heads * D * (1 + 4 / 128)
for round_ in range(2):
    report(f"round {round_} rows kernel, fp32 queries", h200.cuda_time(rows_kernel(raw), iters=10, warmup=2),
           n * heads * D * 4 + operand_bytes)
    report(f"round {round_} rows kernel, bf16 queries", h200.cuda_time(rows_kernel(raw16), iters=10, warmup=2),
           n * heads * D * 2 + operand_bytes)
