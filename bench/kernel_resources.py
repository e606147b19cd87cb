"""A kernel's registers, spills (stack bytes) and shared memory per variant, compiled for sm_90
on any machine: Triton compiles without a GPU, and its bundled cuobjdump reads the cubin.
Spills were a recurring cause of slow variants on the H200 (the seventh session's 0.9 KB a
thread); this shows them before device time is spent on timing. Each kernel compiles with the integer
arguments of a release-shape launch (its `sample`), as Triton specializes them: compiled
without them (every pointer and stride of unknown alignment, as up to the seventeenth
session) the loads are narrow, the indexer's per-head query loads are not pipelined, and
registers and spills came out higher (indexer 255 -> 250 with its queries pipelined, 64
entries a program 179 -> 80; gate/up 480 stack bytes -> none).

Kernels (--kernel): the prefill attention's tensor-core form (attention, the default), the
decode GEMM's transposed kernel (skinny: 6 activation rows of an FP8 weight in 8 columns, exact
mode's three parts cut in the kernel, mma.sync as shipped), the routed experts' gate/up and
down kernels at batch 1's 2-pair blocks (gate_up, down: exact mode's three parts as dot
columns), the indexer's scores in prefill's tiles (indexer) and in decode's few-query form
(indexer_few: 32 heads in one dot, aligned keys decoded in PTX), the top-k's filtering launch
(top_k_filter), faithful prefill attention's Gluon form (attention_gluon), and the decode experts
spike's f16 products in Gluon (experts_gluon, bench/moe_fp8_gluon.py). --loop adds the main loop's SASS instructions a
thread by opcode (the twelfth to twenty-fourth sessions' counts came from it or its throwaway
forms); --serialized ptxas's notes where it serializes a kernel's wgmmas (fifty-sixth session:
none in any shipped form). The H200 machines run Triton 3.6: for their code, put a Triton 3.6 wheel's contents
first on PYTHONPATH.

    python bench/kernel_resources.py [--kernel attention] [--variants "BOTH=1,num_warps=8;QP=2,PP=2"] [--loop]
        [--serialized]
"""
import argparse
import collections
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import NamedTuple

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from triton.experimental.gluon._runtime import GluonASTSource

from dsflash.model.kernels import (common, fp4_moe, fp8_blockwise, fp8_gemm, hc_streams, indexer_score,
                                   indexer_score_gluon, sparse_attention_gluon, sparse_attention_pingpong, top_k)
from dsflash.model.kernels import sparse_attention as sa

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402
import moe_fp8_gluon  # noqa: E402


class Kernel(NamedTuple):
    fn: object  # the @triton.jit (or @gluon.jit) function
    pointers: dict  # argument name -> Triton type where not i32 (or a function of the launch's options)
    defaults: dict  # the shipped launch's constexprs, num_warps and num_stages
    variants: str  # the default --variants
    mma_sync: bool = False  # compiled as common.mma_sync launches it
    # integer arguments as a release-shape launch passes them: Triton specializes a launch's
    # integers that equal 1 (constants) or that 16 divides (known alignment, which decides
    # vector loads and whether a loop's loads are pipelined), and its pointers as 16-byte aligned
    sample: dict | None = None


def _query_type(options: dict) -> str:
    """The indexer's queries: e4m3 codes in faithful prefill's FP8 form, else bf16."""
    return "fp8e4nv" if options.get("FP8") else "bf16"


_EXPERT_POINTERS = {"x_ptr": "*bf16", "h_ptr": "*bf16", "tok_ptr": "*i32", "pair_ptr": "*i32", "wt_ptr": "*fp32",
                    "blk_ptr": "*i32", "w_ptr": "*i16", "s_ptr": "*u8", "o_ptr": "*fp32", "limit": "fp32"}
_EXPERT_DEFAULTS = dict(SPLITS=3, SLOTS=4, PIECES=4, PTX=True, SMALL=True, VECTORS=True, SCALE_WORDS=False, PDL=True,
                        BLOCK_M=2, **fp4_moe.TILES[2])
_EXPERT_VARIANTS = ";BLOCK_M=4;num_stages=2;BLOCK_KU=32;BLOCK_N=128;num_warps=8;SPLITS=1,SLOTS=1"
# batch 1's 6 tokens over the release's widths (hidden 5,120, 2,304 a routed expert): exact
# mode's 3 parts of x as [parts, 4 pieces, tokens, 1,280], h as [parts, 4 pieces, 64 rows, 576]
_EXPERT_SAMPLE = dict(H=5120, INTER=2304, shs=4 * 64 * 576, shq=64 * 576, shp=576)
# the decoded attention forms' pointers and a 16K chunk's integers (both kernels take the same)
_DECODED_POINTERS = {"q_ptr": lambda o: "*fp32" if o.get("HALF") and not o.get("PLAIN") else "*bf16", "t_ptr": "*fp32",
                     "cos_ptr": "*fp32",
                     "sin_ptr": "*fp32", "window_keys": "*bf16", "win_rows": "*i64", "entry_keys": "*bf16",
                     "ent_rows": "*i64", "sink_ptr": "*fp32", "o_ptr": "*fp32", "codes_ptr": "*u8",
                     "scales_ptr": "*fp32", "scale": "fp32"}
_DECODED_SAMPLE = dict(H=64, W=128, K=512, sqn=64 * 512, sqh=512, scn=32, swn=128, sen=512, son=64 * 512, soh=512,
                       ROWS=16384, stn=64 * 128, sth=128)

def _site_kernel(streams: str, variants: str) -> Kernel:
    """hc_streams._hc_site_kernel on streams of that dtype ("fp32" or "bf16": then fn's bf16
    parts too), at a 16K chunk of the release's 4 x 5,120 streams."""
    pointers = {n: "*fp32" for n in ("y_ptr", "post_ptr", "comb_ptr", "pre_ptr", "fn_ptr", "w_ptr", "mixes_ptr",
                                     "row_ptr", "scales_ptr")}
    pointers.update(x_ptr=f"*{streams}", streams_ptr=f"*{streams}", codes_ptr="*u8", mix_eps="fp32", norm_eps="fp32")
    if streams == "bf16":
        pointers["fnp_ptr"] = "*bf16"
    return Kernel(hc_streams._hc_site_kernel, pointers,
                  dict(S=4, NP=32, EXPAND=True, ENCODE=False, HW_FP8=True, PDL=False, BF16=streams == "bf16",
                       FN_PARTS=False, **hc_streams._dots(), **hc_streams.SITE_TILES[True]),
                  variants,
                  sample=dict(T=16384, H=5120, N=24, sxt=20480, sxs=5120, syt=5120, sst=20480, sss=5120, sfn=20480,
                              smt=24, srt=5120, CODE_ROWS=16384))


KERNELS = {
    # one-pass prefill form at the release's shapes as faithful mode launches it (one bf16 part,
    # BF16_PREFILL_TILES); the parity programs it replaced; exact mode's two parts
    "attention": Kernel(
        sa._prefill_attention_kernel,
        {"q_ptr": "*bf16", "ring16_ptr": "*i16", "win_off": "*i64", "win_soff": "*i64", "page_ptr": "*u8",
         "ent_off": "*i64", "ent_soff": "*i64", "sink_ptr": "*fp32", "o_ptr": "*fp32", "part_ml": "*fp32",
         "part_acc": "*fp32", "scale": "fp32"},
        dict(D=512, QP=1, PP=1, PTX=True, GATHERED=True, SPLITS=1, PDL=False,
             **{key: {**sa.PREFILL_TILES, **sa.BF16_PREFILL_TILES}[key]
                for key in ("HB", "KT", "BOTH", "num_warps", "num_stages")}),
        ";BOTH=0,KT=32,num_warps=4;BOTH=1,KT=32;QP=2,PP=2,BOTH=0,KT=32,num_warps=4;QP=2,PP=2",
        # an 8,192-query chunk, 64 heads of 512, the 128-key window and 512 entries (gathered)
        sample=dict(H=64, W=128, K=512, TILES_PER_SPLIT=20, sqp=8192 * 64 * 512, sqn=64 * 512, sqh=512, swn=128,
                    sen=512, son=64 * 512, soh=512)),
    # faithful prefill's Gluon form (sparse_attention_gluon), same launch
    "attention_gluon": Kernel(
        sparse_attention_gluon._attention_kernel,
        {"q_ptr": "*bf16", "ring_ptr": "*u8", "win_off": "*i64", "win_soff": "*i64", "page_ptr": "*u8",
         "ent_off": "*i64", "ent_soff": "*i64", "sink_ptr": "*fp32", "o_ptr": "*fp32", "scale": "fp32"},
        dict(D=sparse_attention_gluon.D_MODEL, HB=sparse_attention_gluon.HEADS, KT=sparse_attention_gluon.KEY_TILE,
             SUB=sparse_attention_gluon.DECODE_ROWS, GATHERED=True, SKIP=0, num_warps=sparse_attention_gluon.WARPS,
             num_stages=1),
        ";GATHERED=0;SUB=32",
        sample=dict(H=64, W=128, K=512, base_code=0, base_scale=0, sqn=64 * 512, sqh=512, swn=128, sen=512, son=64 * 512, soh=512)),
    # its decoded form: bf16 keys by row (sparse_attention_gluon.prefill_attention_decoded)
    "attention_rows": Kernel(
        sparse_attention_gluon._attention_rows_kernel,
        _DECODED_POINTERS,
        # the queries' RoPE inside, the outputs as wo_a's FP8 operand (8 heads a group), three
        # rotating row buffers (a short prompt's queries; a full query's form is ROW_TILES=10 with
        # PV_IN_FLIGHT, STAGED_TILES)
        dict(D=sparse_attention_gluon.D_MODEL, HB=sparse_attention_gluon.HEADS, KT=sparse_attention_gluon.KEY_TILE,
             HALF=32, GROUP_HEADS=8, SKIP=0, ROW_TILES=0, PV_IN_FLIGHT=False, PLAIN=0, COPY_AHEAD=False,
             num_warps=sparse_attention_gluon.WARPS, num_stages=1),
        # fp32 outputs (sparse_attention.ENCODE_IN_ROWS off); the queries rotated by a launch
        # before too (ROPE_IN_ROWS off); a release query's 10 tiles' rows staged once (ROWS_ONCE);
        # the queries in halves (attention_queries.SPLIT_QUERIES)
        ";GROUP_HEADS=0;HALF=0,GROUP_HEADS=0;ROW_TILES=10;ROW_TILES=10,PV_IN_FLIGHT=1;"
        "ROW_TILES=10,PV_IN_FLIGHT=1,PLAIN=384",
        sample=_DECODED_SAMPLE),
    # the same work with its warps specialized (sparse_attention_pingpong): the loader and two
    # compute warpgroups, the registers set per warpgroup
    "attention_pingpong": Kernel(
        sparse_attention_pingpong._attention_pingpong_kernel,
        _DECODED_POINTERS,
        dict(D=sparse_attention_gluon.D_MODEL, HB=sparse_attention_gluon.HEADS, KT=sparse_attention_gluon.KEY_TILE,
             HALF=32, GROUP_HEADS=8, num_warps=4, num_stages=1, maxnreg=sparse_attention_pingpong.MAX_REGS),
        ";GROUP_HEADS=0;HALF=0,GROUP_HEADS=0",
        sample=dict(_DECODED_SAMPLE, skip=0)),
    "skinny": Kernel(
        fp8_gemm._skinny_kernel,
        {"x_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*u8", "y_ptr": "*fp32", "out_ptr": "*fp32", "count_ptr": "*i32"},
        dict(FP8_WEIGHT=True, SMALL=True, SPLIT=True, PTX=True, EVEN_K=True, GROUP_ROWS=0, SUM_GROUP=1,
             HEADS=False, PDL=True, **fp8_gemm._skinny_tiles(32768, 6)),
        ";PDL=0;BLOCK_M=16;SUM_GROUP=8;num_stages=2;BLOCK_N=128;BLOCK_N=128,num_warps=4;BLOCK_K=64", mma_sync=True,
        sample=dict(M=6, N=32768, K=1280, K_PER_SPLIT=640, SPLITS=2, sxm=1280, sxk=1, swn=320, ssn=40, ssk=1,
                    sys=6 * 32768, sym=32768, syn=1)),  # wq_b at 6 rows
    # the same kernel on an fp32 weight: an mHC site's mixes at decode rows ([6, 20480] x [20480, 24]),
    # its dots in Triton's tf32x3 (shipped) or common.dot_fp32's masked heads (HEADS=1)
    "skinny_fp32": Kernel(
        fp8_gemm._skinny_kernel,
        {"x_ptr": "*fp32", "w_ptr": "*fp32", "s_ptr": "*u8", "y_ptr": "*fp32", "out_ptr": "*fp32", "count_ptr": "*i32"},
        dict(FP8_WEIGHT=False, SMALL=False, SPLIT=True, PTX=True, EVEN_K=True, GROUP_ROWS=0, SUM_GROUP=8,
             HEADS=common.TF32_HEADS, PDL=True, **fp8_gemm._skinny_tiles(24, 6)),
        ";HEADS=1", mma_sync=True,
        sample=dict(M=6, N=24, K=20480, K_PER_SPLIT=128, SPLITS=160, sxm=20480, sxk=1, swn=20480, ssn=0, ssk=0,
                    sys=6 * 24, sym=24, syn=1)),
    "gate_up": Kernel(fp4_moe._gate_up_kernel, _EXPERT_POINTERS, dict(_EXPERT_DEFAULTS, ACT_QUANT=False),
                      _EXPERT_VARIANTS, sample=dict(_EXPERT_SAMPLE, sxs=6 * 5120, sxq=1280, sxt=5120, swe=4608 * 1280,
                                                    swr=1280, sse=4608 * 160, ssr=160)),
    "down": Kernel(fp4_moe._down_kernel, _EXPERT_POINTERS, _EXPERT_DEFAULTS, _EXPERT_VARIANTS,
                   sample=dict(_EXPERT_SAMPLE, swe=5120 * 576, swr=576, sse=5120 * 72, ssr=72, sop=5120, soh=1)),
    # the indexer's scores in prefill's tall tiles, FP4-quantized queries in one bf16 pass
    "indexer": Kernel(
        indexer_score._indexer_kernel,
        {"q_ptr": lambda o: (f"tensordesc<{_query_type(o)}[{o['QB']},{o['DI']}]>" if o["TMA"] else f"*{_query_type(o)}"),
         "w_ptr": "*fp32",
         "vis_ptr": "*i64", "page_ptr": "*u8", "k_off": "*i64", "k_soff": "*i64", "o_ptr": "*fp32",
         "first_ptr": "*i64", "count_ptr": "*i64", "kept_ptr": "*u8", "floor_ptr": "*i32", "top_kept_ptr": "*fp32",
         "top_id_ptr": "*i32", "top_count_ptr": "*i32", "top_ptr": "*i32"},
        dict(DI=128, RUNS=False, BF16=True, TMA=indexer_score.QUERY_TILES_BY_TMA, num_stages=3, PDL=False, FP8=False,
             HW_FP8=False, KEPT_BLOCK=0, KEEP=False, KEEP_PTX=False,
             **dict(zip(("QB", "NB", "num_warps"), indexer_score.TILES["tall"]))),
        ";NB=64;num_warps=4;QB=128;FP8=1,HW_FP8=1,BF16=0;FP8=1,HW_FP8=1,BF16=0,KEPT_BLOCK=8;KEPT_BLOCK=8"
        ";FP8=1,HW_FP8=1,BF16=0,KEEP=1,KEEP_PTX=1;FP8=1,HW_FP8=1,BF16=0,KEPT_BLOCK=8,KEEP=1,KEEP_PTX=1"
        ";FP8=1,HW_FP8=1,BF16=0,KEEP=1",
        # an 8,192-token chunk's queries, 32 heads of 128 (the release), against 131,071 entries
        # in rows padded to 131,072 (indexer.PADDED_ROWS; with KEPT_BLOCK, the release's
        # candidate pool: blocks of 8 entries); KEEP: the top-k's filtering in the epilogue (KEEP_PTX:
        # the GPU's form, a branch a score; without it the interpreter's, which spills)
        sample=dict(n=8192, N=131071, NP=131072, HI=32, sqn=32 * 128, sqh=128, swn=32, son=131072, skr=131071,
                    skn=16384, kept_row=0)),
    # the FP8 tall tiles in Gluon (indexer_score_gluon), the same launch's shapes
    "indexer_gluon": Kernel(
        indexer_score_gluon._scores_kernel,
        {"q_ptr": "*fp8e4nv", "w_ptr": "*fp32", "vis_ptr": "*i64", "page_ptr": "*u8", "k_off": "*i64",
         "k_soff": "*i64", "o_ptr": "*fp32"},
        dict(DI=128, HI=32, QB=64, NB=128, num_warps=4), ";NB=64;QB=128,num_warps=8;QB=128,NB=64,num_warps=8",
        sample=dict(n=8192, N=131071, NP=131072, sqn=32 * 128, swn=32, son=131072)),
    # faithful prefill's index queries as e4m3 codes (fp8_queries): 32 rows of a head a program
    "fp8_queries": Kernel(
        indexer_score._fp8_queries_kernel,
        {"q_ptr": "*fp32", "w_ptr": "*fp32", "codes_ptr": "*u8", "scaled_ptr": "*fp32"},
        dict(DI=128, RB=32, HW_FP8=True, num_warps=4, num_stages=3), "",
        sample=dict(n=16384, sqn=32 * 128, sqh=128, swn=32, swh=1)),
    # faithful prefill's FP8 operand encode (fp8_blockwise): a chunk's routed pairs' rows into the
    # experts' down projections (SEGMENTS), bf16 rows, or the SwiGLU of fp32 gate/up in the launch
    "fp8_rows": Kernel(
        fp8_blockwise._rows_kernel,
        {"x_ptr": lambda o: "*u8" if o["ENCODED"] else "*fp32" if o["SWIGLU"] or o["ROUND_FIRST"] else "*bf16",
         "up_ptr": "*fp32",
         "weights_ptr": "*fp32",
         "codes_ptr": "*u8", "scales_ptr": "*fp32", "starts_ptr": "*i32", "counts_ptr": "*i32", "source_ptr": "*i64",
         "limit": "fp32"},
        dict(GROUP_K=2304, TILE_ROWS=fp8_blockwise.ROW_TILE[0], TILE_BLOCKS=fp8_blockwise.ROW_TILE[1],
             SEGMENTS=True, GATHER=False, SWIGLU=False, WEIGHTED=False, ROUND_FIRST=False, ENCODED=False,
             HW_FP8=True, num_warps=4, num_stages=3),
        ";SWIGLU=1,WEIGHTED=1;TILE_ROWS=32,TILE_BLOCKS=1;TILE_ROWS=32,TILE_BLOCKS=1,SWIGLU=1,WEIGHTED=1"
        ";ROUND_FIRST=1;TILE_ROWS=32,TILE_BLOCKS=1,ROUND_FIRST=1;GATHER=1;GATHER=1,ENCODED=1",
        sample=dict(M=98304, ROWS=98304, K_ALL=2304, sxm=4608, SRC_ROWS=16384)),
    # the top-k's filtering launch over score rows padded to a multiple of 16 (indexer.PADDED_ROWS):
    # 256 rows of 512K entries (a prefill slice), 32 chunks a row. Rows of an odd length made its
    # loads 4-byte LDGSTS (24 a step against 6 LDGSTS.128), forty-third session
    "top_k_filter": Kernel(
        top_k._filter_kernel,
        {"x_ptr": "*fp32", "floor_ptr": "*i32", "kept_ptr": "*fp32", "id_ptr": "*i32", "count_ptr": "*i32",
         "top_ptr": "*i32"},
        dict(CAPACITY=top_k.CAPACITY, BLOCK=top_k.FILTER_PLANS["many rows"].block, STAGES=top_k.FILTER_STAGES,
             ATOMIC=True, num_warps=top_k.FILTER_WARPS, num_stages=3, PDL=False, PTX=False, IN_TURN=False),
        ";ATOMIC=0;PTX=1;PTX=1,IN_TURN=1",
        sample=dict(N=524288, sxr=524288, chunk_len=16384, chunks=32, pairs=4096)),
    # a prefill mHC site in one read of its streams (hc_streams.hc_site): the FFN site's with the
    # attention's expand (the shipped tiles), the attention site's without, and other tiles
    "hc_site": _site_kernel(
        "fp32", ";EXPAND=0,TB=64;RAW_HEADS=0;RAW_HEADS=0,TF32_HEADS=1;EXPAND=0,TB=64,RAW_HEADS=0,TF32_HEADS=1;"
        "TB=64;TB=64,BLOCK=16;num_warps=8;ENCODE=1;EXPAND=0,TB=64,ENCODE=1"),
    # the same site on bf16 streams (layers/mhc.BF16_STREAMS): half the bytes, the same dots or
    # (FN_PARTS, hc_streams.BF16_DOTS) bf16 MMAs against fn's three bf16 parts
    "hc_site_bf16": _site_kernel(
        "bf16", ";EXPAND=0,TB=64;FN_PARTS=1;EXPAND=0,TB=64,FN_PARTS=1;FN_PARTS=1,TB=64;FN_PARTS=1,TB=16;"
        "FN_PARTS=1,BLOCK=64;FN_PARTS=1,num_warps=8"),
    # a prefill mHC site's mixes alone (hc_streams.hc_mixes: where hc_site does not take a site)
    "hc_mixes": Kernel(
        hc_streams._hc_mixes_kernel,
        {"x_ptr": "*fp32", "fn_ptr": "*fp32", "out_ptr": "*fp32", "part_ptr": "*fp32", "squares_ptr": "*fp32",
         "eps": "fp32"},
        dict(BLOCK_N=32, PDL=False, **hc_streams._dots(), **hc_streams.MIXES_TILES),
        ";RAW_HEADS=0;RAW_HEADS=0,TF32_HEADS=1",
        sample=dict(T=16384, N=24, K=20480, K_PER_SPLIT=5120, sxt=20480, sfn=20480, sot=24)),
    # decode's few-query form: a verify block's 6 queries against 1M entries, the 32 heads in one dot
    "indexer_few": Kernel(
        indexer_score._indexer_few_kernel,
        {"q_ptr": "*bf16", "w_ptr": "*fp32", "vis_ptr": "*i64", "page_ptr": "*u8", "k_off": "*i64", "k_soff": "*i64",
         "o_ptr": "*fp32", "first_ptr": "*i64", "count_ptr": "*i64"},
        dict(DI=128, RUNS=False, BF16=True, QN=8, QC=indexer_score.FEW_QUERY_COLUMNS, GH=32, CHAIN=False,
             HOIST=True, ALIGNED=True, PTX=True, num_stages=1, PDL=False,
             **dict(zip(("NB", "num_warps"), indexer_score.FEW_TILES))),
        ";PTX=0;ALIGNED=0,PTX=0;QN=16,HOIST=0;GH=16,CHAIN=1,HOIST=0",
        sample=dict(n=6, N=1048575, HI=32, sqn=32 * 128, sqh=128, swn=32, son=1048575, skr=1048575,
                    programs=indexer_score.FEW_PROGRAMS)),
    # the decode experts spike's gate/up rows on f16 mma.sync in Gluon (bench/moe_fp8_gluon.py), 2-pair
    # blocks; F8=1 gives mma.sync its e4m3 form, which ptxas turns into f16 conversions and f16 MMAs
    "experts_gluon": Kernel(
        moe_fp8_gluon._products_kernel,
        {"a_ptr": "*u8", "as_ptr": "*u8", "src_ptr": "*i32", "blk_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8",
         "out_ptr": "*fp32"},
        dict(COLS=2, NW=8, SWR=2560, F8=False, F16_BITS=False, PREFETCH=True, **moe_fp8_gluon.TILES["128x4w"]),
        ";BLOCK_N=64;NW=16;F8=1;F16_BITS=1;PREFETCH=0",
        sample=dict(N=4608, K=5120, sar=5120, sasr=160, swe=4608 * 2560, sse=4608 * 160, ssr=160, sor=4608)),
}


def compile_for_sm90(kernel: Kernel, options: dict):
    fn = kernel.fn
    gluon = fn.is_gluon()  # a Gluon kernel takes num_warps as a constexpr argument too
    launch = ("num_warps", "num_stages", "maxnreg")
    constexprs = {k: v for k, v in options.items() if k not in launch or (gluon and k in fn.arg_names)}
    # integers the kernel leaves unspecialized (do_not_specialize) are neither constants nor aligned
    unspecialized = {p.name for p in fn.params if p.do_not_specialize}
    ones = {n: 1 for n, v in (kernel.sample or {}).items() if v == 1 and n not in unspecialized}
    constexprs.update(ones)
    types = {n: ty(options) if callable(ty) else ty for n, ty in kernel.pointers.items()}
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
    aligned = [n for n in fn.arg_names if n not in constexprs and (signature[n][0] == "*" or (
        kernel.sample is not None and n not in unspecialized and kernel.sample.get(n, 1) % 16 == 0))]
    source = (GluonASTSource if gluon else ASTSource)(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()},
                       attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    if kernel.mma_sync:  # as common.mma_sync compiles the shipped launch
        os.environ["DISABLE_MMA_V3"] = "1"
    try:
        return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={k: options[k] for k in launch if k in options})
    finally:
        os.environ.pop("DISABLE_MMA_V3", None)


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def cuobjdump(compiled, flag: str) -> str:
    """Triton's bundled cuobjdump run on the compiled cubin (no GPU needed)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([_tool("cuobjdump"), flag, cubin.name], capture_output=True, text=True).stdout


def serialized(compiled) -> str:
    """ptxas's notes on the kernel's wgmmas (C7510-C7520: each serializes every wgmma of the
    kernel, e.g. C7515 where a non-wgmma instruction writes an accumulator while a wgmma may be
    in flight, which a loop's zero-trip path can do), from Triton's bundled ptxas run again on
    the kernel's PTX with -v; "none" where it has none or no wgmma."""
    if "wgmma" not in compiled.asm["ptx"]:
        return "none (no wgmma)"
    from triton.backends.nvidia.compiler import get_ptxas  # the ptxas Triton itself takes for sm_90 (3.9: 13.x)
    with tempfile.TemporaryDirectory() as folder:
        ptx = os.path.join(folder, "kernel.ptx")
        with open(ptx, "w") as out:
            out.write(compiled.asm["ptx"])
        arch = "sm_90a" if "sm_90a" in compiled.asm["ptx"] else "sm_90"
        run = subprocess.run([get_ptxas(90).path, f"-arch={arch}", "-v", ptx, "-o",
                              os.path.join(folder, "kernel.cubin")], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"ptxas failed on the kernel's PTX: {run.stderr[-2000:]}")
    notes = sorted({m.group(1) for m in re.finditer(r"\((C75\d\d)\)", run.stdout + run.stderr)})
    return ", ".join(notes) or "none"


def resources(compiled) -> str:
    usage = cuobjdump(compiled, "--dump-resource-usage")
    line = next((part.strip() for part in usage.splitlines() if "REG:" in part), usage[-200:])
    return f"{line.split(' SHARED')[0]} dynamic_shared={compiled.metadata.shared}"


def main_loop(compiled, top: int = 12) -> str:
    """The kernel's longest loop in SASS (a backward branch and its target): its instruction
    count, a thread's per trip, and the opcodes it spends them on. In a decode kernel that loop
    is the K step, and its count against the bytes a step reads says whether issuing
    instructions can keep up with HBM."""
    lines = [line for line in cuobjdump(compiled, "-sass").splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    index = {int(re.match(r"\s+/\*([0-9a-f]{4})\*/", line).group(1), 16): i for i, line in enumerate(lines)}
    loops = [(index[target], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA\s+0x([0-9a-f]+)", line)) and (target := int(m.group(1), 16)) in index
             and index[target] < i]
    if not loops:
        return "no loop"
    first, last = max(loops, key=lambda loop: loop[1] - loop[0])
    ops = collections.Counter(re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line).group(1)
                              for line in lines[first:last + 1])
    return f"loop {last - first + 1} instructions: " + ", ".join(f"{op} {n}" for op, n in ops.most_common(top))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", default="attention", choices=sorted(KERNELS))
    parser.add_argument("--variants", help="';'-separated variants of KEY=VALUE pairs ('' is the shipped launch)")
    parser.add_argument("--loop", action="store_true", help="also the main loop's SASS instructions by opcode")
    parser.add_argument("--serialized", action="store_true", help="also ptxas's wgmma serialization notes (C75xx)")
    args = parser.parse_args()
    kernel = KERNELS[args.kernel]
    text = kernel.variants if args.variants is None else args.variants
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    for label, variant in zip(text.split(";"), h200.variants(text)):
        compiled = compile_for_sm90(kernel, {**kernel.defaults, **variant})
        print(f"[resources] {args.kernel} {label or 'shipped'}: {resources(compiled)}", flush=True)
        if args.loop:
            print(f"[resources]   {main_loop(compiled)}", flush=True)
        if args.serialized:
            print(f"[resources]   wgmma serialized by: {serialized(compiled)}", flush=True)


if __name__ == "__main__":
    main()
