"""A kernel's registers, spills (stack bytes) and shared memory per variant, compiled for sm_90
on any machine: Triton compiles without a GPU, and its bundled cuobjdump reads the cubin.
Spills were a recurring cause of slow variants on the H200 (the seventh session's 0.9 KB a
thread); this shows them before device time is spent on timing.

Kernels (--kernel): the prefill attention's tensor-core form (attention, the default), the
decode GEMM's transposed kernel (skinny: 6 activation rows of an FP8 weight, exact mode's three
parts cut in the kernel, mma.sync as shipped), the routed experts' gate/up and down kernels
at batch 1's 4-pair blocks (gate_up, down: exact mode's three parts as dot columns), and the
indexer's scores in prefill's tiles (indexer).

    python bench/kernel_resources.py [--kernel attention] [--variants "BOTH=1,num_warps=8;QP=2,PP=2"]
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import NamedTuple

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsflash.model.kernels import fp4_moe, fp8_gemm, indexer_score
from dsflash.model.kernels import sparse_attention as sa

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402


class Kernel(NamedTuple):
    fn: object  # the @triton.jit function
    pointers: dict  # argument name -> Triton type where not i32
    defaults: dict  # the shipped launch's constexprs, num_warps and num_stages
    variants: str  # the default --variants
    mma_sync: bool = False  # compiled as common.mma_sync launches it


_EXPERT_POINTERS = {"x_ptr": "*bf16", "h_ptr": "*bf16", "tok_ptr": "*i32", "pair_ptr": "*i32", "wt_ptr": "*fp32",
                    "blk_ptr": "*i32", "w_ptr": "*i16", "s_ptr": "*u8", "o_ptr": "*fp32", "limit": "fp32"}
_EXPERT_DEFAULTS = dict(SPLITS=3, SLOTS=4, PIECES=4, PTX=True, SMALL=True, VECTORS=True, SCALE_WORDS=False,
                        BLOCK_M=4, **fp4_moe.TILES[4])
_EXPERT_VARIANTS = ";num_stages=2;BLOCK_KU=32;BLOCK_N=128;num_warps=8;SPLITS=1,SLOTS=1"
KERNELS = {
    # one-pass prefill form at the release's shapes as faithful mode launches it (one bf16 part,
    # BF16_PREFILL_TILES); the parity programs it replaced; exact mode's two parts
    "attention": Kernel(
        sa._prefill_attention_kernel,
        {"q_ptr": "*bf16", "ring16_ptr": "*i16", "win_off": "*i64", "win_soff": "*i64", "page_ptr": "*u8",
         "ent_off": "*i64", "ent_soff": "*i64", "sink_ptr": "*fp32", "o_ptr": "*fp32", "part_ml": "*fp32",
         "part_acc": "*fp32", "scale": "fp32"},
        dict(D=512, QP=1, PP=1, PTX=True, GATHERED=True, SPLITS=1,
             **{key: {**sa.PREFILL_TILES, **sa.BF16_PREFILL_TILES}[key]
                for key in ("HB", "KT", "BOTH", "num_warps", "num_stages")}),
        ";BOTH=0,KT=32,num_warps=4;BOTH=1,KT=32;QP=2,PP=2,BOTH=0,KT=32,num_warps=4;QP=2,PP=2"),
    "skinny": Kernel(
        fp8_gemm._skinny_kernel,
        {"x_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*u8", "y_ptr": "*fp32", "out_ptr": "*fp32", "count_ptr": "*i32"},
        dict(FP8_WEIGHT=True, SMALL=True, SPLIT=True, PTX=True, EVEN_K=True, GROUP_ROWS=0, SUM_GROUP=1,
             **fp8_gemm.SKINNY_TILES),
        ";SUM_GROUP=8;num_stages=2;BLOCK_N=128;BLOCK_N=128,num_warps=4;BLOCK_K=64", mma_sync=True),
    "gate_up": Kernel(fp4_moe._gate_up_kernel, _EXPERT_POINTERS, dict(_EXPERT_DEFAULTS, ACT_QUANT=False),
                      _EXPERT_VARIANTS),
    "down": Kernel(fp4_moe._down_kernel, _EXPERT_POINTERS, _EXPERT_DEFAULTS, _EXPERT_VARIANTS),
    # the indexer's scores in prefill's tall tiles, FP4-quantized queries in one bf16 pass
    "indexer": Kernel(
        indexer_score._indexer_kernel,
        {"q_ptr": "*bf16", "w_ptr": "*fp32", "vis_ptr": "*i64", "page_ptr": "*u8", "k_off": "*i64",
         "k_soff": "*i64", "o_ptr": "*fp32", "first_ptr": "*i64", "count_ptr": "*i64"},
        dict(DI=128, RUNS=False, BF16=True, num_stages=3,
             **dict(zip(("QB", "NB", "num_warps"), indexer_score.TILES["tall"]))),
        ";NB=64;num_warps=4;QB=128"),
}


def resources(kernel: Kernel, options: dict) -> str:
    fn = kernel.fn
    constexprs = {k: v for k, v in options.items() if k not in ("num_warps", "num_stages")}
    signature = {n: "constexpr" if n in constexprs else kernel.pointers.get(n, "i32") for n in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()})
    if kernel.mma_sync:  # as common.mma_sync compiles the shipped launch
        os.environ["DISABLE_MMA_V3"] = "1"
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options=dict(num_warps=options["num_warps"], num_stages=options["num_stages"]))
    finally:
        os.environ.pop("DISABLE_MMA_V3", None)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([tool, "--dump-resource-usage", cubin.name], capture_output=True, text=True).stdout
    line = next((part.strip() for part in usage.splitlines() if "REG:" in part), usage[-200:])
    return f"{line.split(' SHARED')[0]} dynamic_shared={compiled.metadata.shared}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default="attention", choices=sorted(KERNELS))
    parser.add_argument("--variants", help="';'-separated variants of KEY=VALUE pairs ('' is the shipped launch)")
    args = parser.parse_args()
    kernel = KERNELS[args.kernel]
    text = kernel.variants if args.variants is None else args.variants
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    for label, variant in zip(text.split(";"), h200.variants(text)):
        print(f"[resources] {args.kernel} {label or 'shipped'}: {resources(kernel, {**kernel.defaults, **variant})}",
              flush=True)


if __name__ == "__main__":
    main()
