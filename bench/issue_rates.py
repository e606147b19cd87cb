"""How fast an SM issues the instructions the decode kernels spend their loops on.

Why: the routed experts at decode are bound by decoding their FP4 codes (bench/moe_floor.py),
and a decode's forms trade one kind of instruction for another: the FP8 spike's f16 dots
convert e4m3 pairs to f16 (cvt.rn.f16x2.e4m3x2, SASS F2FP), where decoding straight to f16
takes PRMTs instead (bench/moe_fp8_gluon.py's F16_BITS); the shipped kernels multiply by the
scales in HMUL2 and the decode GEMM packs bf16 parts (F2FP.BF16.F32.PACK_AB). Counting SASS
instructions ranks such forms only if each kind issues at the same rate; the CUDA guide lists
conversions at a fraction of the integer rate. This measures each kind: every thread runs 8
independent chains of one instruction (each step reads its chain and the next one's value),
enough warps on every SM to hide the latency, and the rate is the chains' steps a second a SM,
printed beside LOP3's. sm_90 SASS of each loop (Triton 3.9): 128 of the instruction a block, but
HMUL2's half HFMA2s and the e4m3 conversions' 16 PRMTs more.

    python bench/issue_rates.py [--iters 4096]
"""
import argparse
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402

CHAINS = 8
STEPS = 16  # steps of every chain in one asm block

# one step of chain $k, reading chain $n (0 <= k, n < 8): PTX, with {k} and {n} filled in
STEP = {
    "lop3": "lop3.b32 ${k}, ${k}, ${n}, 0x5A5A5A5A, 0x96;",
    "prmt": "prmt.b32 ${k}, ${k}, ${n}, 0x5140;",
    "shf": "shf.l.wrap.b32 ${k}, ${k}, ${n}, 3;",
    "imad": "mad.lo.u32 ${k}, ${k}, ${n}, 0x9E3779B9;",
    "hmul2": "mul.rn.f16x2 ${k}, ${k}, ${n};",
    "ffma": "fma.rn.f32 ${k}, ${k}, ${n}, 0f3F800000;",
    # (the chain's own low half: another register's costs a PRMT a step, 16 a block this way)
    "f2fp_e4m3": "mov.b32 {{l, h}}, ${k}; cvt.rn.f16x2.e4m3x2 ${k}, l;",
    "f2fp_bf16": "cvt.rn.bf16x2.f32 ${k}, ${k}, ${n};",
}


def asm_block(op: str) -> str:
    """STEPS steps of the 8 chains: outputs $0..$7 start from inputs $8..$15."""
    lines = [".reg .b16 l, h;"] + [f"mov.b32 ${k}, ${k + CHAINS};" for k in range(CHAINS)]
    for _ in range(STEPS):
        lines += [STEP[op].format(k=k, n=(k + 1) % CHAINS) for k in range(CHAINS)]
    return "{\n" + "\n".join(lines) + "\n}"


@triton.jit
def _chains_kernel(out_ptr, iters, ASM: tl.constexpr):
    i = tl.program_id(0) * 128 + tl.arange(0, 128)
    a0, a1, a2, a3, a4, a5, a6, a7 = i, i + 1, i + 2, i + 3, i * 5, i * 7, i * 11, i * 13
    for _ in range(iters):
        a0, a1, a2, a3, a4, a5, a6, a7 = tl.inline_asm_elementwise(
            ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r", [a0, a1, a2, a3, a4, a5, a6, a7],
            dtype=(tl.int32,) * 8, is_pure=True, pack=1)
    tl.store(out_ptr + i, a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=4096)
    parser.add_argument("--ops", default=",".join(STEP))
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = sms * 16  # 64 warps an SM, resident at once where registers allow
    out = torch.empty(programs * 128, dtype=torch.int32, device="cuda")
    steps = programs * 128 * args.iters * STEPS * CHAINS
    print(f"[issue] {torch.cuda.get_device_name()}, {sms} SMs; {CHAINS} chains a thread, {programs} programs "
          f"of 4 warps", flush=True)
    rates = {}
    for op in args.ops.split(","):
        block = asm_block(op)

        def run(block=block):
            _chains_kernel[(programs,)](out, args.iters, ASM=block, num_warps=4)
        run()
        seconds = h200.cuda_time(run, iters=5, warmup=1)
        rates[op] = steps / seconds / sms / 1e9  # per ns a SM
        print(f"[issue] {op}: {rates[op]:.1f} a ns a SM ({rates[op] / rates.get('lop3', rates[op]):.2f} of LOP3's; "
              f"{seconds * 1e3:.2f} ms)", flush=True)


if __name__ == "__main__":
    main()
