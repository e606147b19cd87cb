"""GPU benchmarks on the `bench` preset (release widths and depth, 48 routed experts), each
figure printed next to its physical limit: bytes at 4.2 TB/s HBM read (decode is memory
bound), FLOPs at 694 TFLOP/s bf16 (prefill). Results also go to $OUT/h200.json.

    python bench/h200.py [--sections kernels,decode_gemms,decode,reference,prefill] [--budget-s 540]

The reference section runs the plain-PyTorch path on the same weights: a batch-1 decode step,
and a prefill of --reference-prefill tokens on both paths (the fast path's first, twice, the
first compiling its kernels, so the two figures come from one run and both are warm).

Decode caches are filled with synthetic bytes (valid FP8/FP4 codes) to the target context:
a step's cost does not depend on the values, and building a 1M-token cache by prefill is a
separate measurement. Weights are built in device memory with the preset's shapes and
formats (model/checkpoint_writer.random_weight_store).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import math
import os
import pathlib
import tempfile
import time
from typing import NamedTuple

import torch

HBM_BPS = 4.2e12  # measured H200 HBM read bandwidth (issue 9)
BF16_FLOPS = 694e12
FP8_FLOPS = 1276e12
RESULTS: dict = {}
DEADLINE = [0.0]
PROFILE = [False]
REPORTING = [True]
DEV = "cuda"  # --device cpu with --preset tiny: a smoke test of this script (Triton interpreter)
COMPILES: list = []  # (seconds, kernel) of each Triton compile since watch_compiles


def watch_compiles() -> None:
    """Note every Triton compile from now on in COMPILES: a prefill's record counts those inside
    its timed run, which its warm-up missed (fifty-seventh session: 11 in a first 1M prefill, 1.6 s)."""
    from dsflash.model.kernels.compile_watch import kernel_name, watch

    watch(lambda took, launch, _: COMPILES.append((took, kernel_name(launch))))


def out_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("OUT", "."))
    path.mkdir(parents=True, exist_ok=True)
    return path


def record(section: str, key: str, value: dict) -> None:
    if not REPORTING[0]:
        return  # a --tp rank other than 0
    RESULTS.setdefault(section, {})[key] = value
    (out_dir() / "h200.json").write_text(json.dumps(RESULTS, indent=1))
    print(f"[{section}] {key}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in value.items()), flush=True)


def time_left() -> float:
    return DEADLINE[0] - time.monotonic()


def sync() -> None:
    if DEV.startswith("cuda"):
        torch.cuda.synchronize()


def cuda_time(fn, iters: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def graph_time(fn, iters: int = 20) -> float:
    """GPU time per call of fn with `iters` calls captured in one CUDA graph, as a decode step
    runs them: no host launch cost (decode-sized kernels take a few us, Python launches 20-100).
    The same weights are read each call, so ones that fit in the 50 MB L2 look faster."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    return cuda_time(graph.replay, iters=5, warmup=1) / iters


def random_fp8(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random FP8 weight on the GPU as a checkpoint holds one: e4m3 codes (no NaN) and e8m0
    scales of 32 x 32 blocks small enough for the GEMMs' one-multiply decoder (small=True)."""
    codes = torch.randint(0, 255, (n, k), dtype=torch.uint8, device="cuda")
    codes[(codes & 0x7F) == 0x7F] = 0x30  # no NaN codes
    scales = torch.randint(115, 125, (-(-n // 32), -(-k // 32)), dtype=torch.uint8, device="cuda")
    return codes, scales


def time_nothing() -> None:
    """A --device cpu smoke run (the Triton interpreter): the timers run their function once
    and report nan."""
    global cuda_time, graph_time
    cuda_time = graph_time = lambda fn, **_: (fn(), float("nan"))[1]


def launch_times(fn, calls: int = 5) -> dict[str, float]:
    """us a call of each Triton kernel fn launches (torch profiler, eager launches), by name."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.self_device_time_total / calls for e in prof.key_averages() if e.key.startswith("_")}


def rotating_graph_time(fn, copies: int, rounds: int = 2) -> float:
    """GPU time per call of fn(i) (i picks one of `copies` weights), replayed in a CUDA graph:
    cycling through copies larger together than the 50 MB L2 makes every call read HBM, as a
    decode step's once-per-step weights do."""
    return graph_time(lambda: [fn(i) for i in range(copies)], iters=rounds) / copies


def variants(text: str) -> list[dict]:
    """';'-separated launch variants of KEY=VALUE pairs (integers) -> dicts; an empty one is {}."""
    return [{key: int(value) for key, value in (pair.split("=") for pair in filter(None, v.split(",")))}
            for v in text.split(";")]


def module_switch(path: str, values: list[str]) -> tuple:
    """'package.module.ATTR' and Python literals -> (module, 'ATTR', values): a switch a bench
    sets to each value in turn (decode_ab.py, decode_gemm_floor.py --switch)."""
    module_name, attribute = path.rsplit(".", 1)
    return importlib.import_module(module_name), attribute, [ast.literal_eval(v) for v in values]


# ------------------------------------------------------------------ ceilings


def ceilings() -> None:
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    x.random_(0, 255)
    t = cuda_time(lambda: x.view(torch.int64).sum(), iters=10)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    tm = cuda_time(lambda: a @ a, iters=10)
    record("ceilings", "measured", {"hbm_read_TBps": x.numel() / t / 1e12, "bf16_matmul_TFLOPs": 2 * 8192**3 / tm / 1e12,
                                    "used_hbm_TBps": HBM_BPS / 1e12, "used_bf16_TFLOPs": BF16_FLOPS / 1e12})
    x = a = None  # frees the GPU memory (not del: the lambdas above name them)


# ------------------------------------------------------------------ kernels at real shapes


def skinny_tiles(name: str, codes: torch.Tensor, scales: torch.Tensor, nbytes: int) -> None:
    """Decode-sized (6-row) FP8 GEMMs through the transposed kernel, by tile shape
    (model/kernels/fp8_gemm.SKINNY_TILES), and through the general one's decoder (small=False)."""
    from dsflash.model.kernels import fp8_gemm as gemm

    x = torch.randn(6, codes.shape[1], device="cuda")
    ref = gemm.fp8_gemm_ref(x, codes, scales)
    default = dict(gemm.SKINNY_TILES)
    for n, kb, w, st in [(64, 128, 4, 3), (128, 128, 8, 3), (256, 128, 8, 3), (128, 256, 8, 3), (128, 64, 8, 4),
                         (32, 128, 4, 3)]:
        gemm.SKINNY_TILES.update(BLOCK_N=n, BLOCK_K=kb, num_warps=w, num_stages=st)
        for small in (True, False):
            try:
                t = graph_time(lambda: gemm.fp8_gemm(x, codes, scales, small=small))
                err = ((gemm.fp8_gemm(x, codes, scales, small=small) - ref).abs().max() / ref.abs().max()).item()
            except Exception as exc:  # a shape the compiler cannot fit
                record("kernel_fp8_skinny", f"{name}_N{n}_K{kb}_w{w}_s{st}_small{small}", {"error": type(exc).__name__})
                continue
            record("kernel_fp8_skinny", f"{name}_N{n}_K{kb}_w{w}_s{st}_small{small}",
                   {"us": t * 1e6, "ratio_to_roofline": t / (nbytes / HBM_BPS), "max_rel_error": err})
    gemm.SKINNY_TILES.clear()
    gemm.SKINNY_TILES.update(default)
    chosen, gemm.SKINNY_FP8 = gemm.SKINNY_FP8, False  # the tile kernel, as before the transposed one
    t = graph_time(lambda: gemm.fp8_gemm(x, codes, scales, small=True))
    record("kernel_fp8_skinny", f"{name}_tile_kernel", {"us": t * 1e6, "ratio_to_roofline": t / (nbytes / HBM_BPS)})
    gemm.SKINNY_FP8 = chosen


# The FP8 weights a decode step multiplies by (bench preset), [N, K]
DECODE_GEMMS = {"wq_a": (1280, 5120), "wkv": (512, 5120), "wq_b": (32768, 1280), "wo_b": (5120, 8192),
                "shared_w1": (2304, 5120), "shared_w2": (5120, 2304), "indexer_wq_b": (4096, 1280),
                "main_proj": (5120, 15360), "engram_wkv": (25600, 6144)}


def decode_gemms(rows=(1, 6, 8, 16, 48)) -> None:
    """The decode step's FP8 GEMMs at their real shapes, each against the time to read its
    bytes once (weights rotate through copies: no L2 hits)."""
    from dsflash.model.kernels.fp8_gemm import fp8_gemm

    for name, (n, k) in DECODE_GEMMS.items():
        nbytes = n * k + (n // 32) * (k // 32)
        copies = max(2, math.ceil(320e6 / nbytes))
        codes = [torch.randint(0, 0x77, (n, k), dtype=torch.uint8, device="cuda") for _ in range(copies)]
        scales = [torch.full((n // 32, k // 32), 120, dtype=torch.uint8, device="cuda") for _ in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device="cuda")
            t = rotating_graph_time(lambda i: fp8_gemm(x, codes[i], scales[i], small=True), copies)
            record("decode_gemm", f"{name}_M{m}", {"us": t * 1e6, "roofline_us": nbytes / HBM_BPS * 1e6,
                                                   "ratio_to_roofline": t / (nbytes / HBM_BPS),
                                                   "TBps": nbytes / t / 1e12})
        codes = scales = None  # frees the copies (not del: the lambdas name them)


def bf16_gemms() -> None:
    """The bf16-weight GEMMs at decode size (router, LM head) against torch's fp32 matmul of the
    upcast weight, which the fast path used before; the fp32 mHC mix projection likewise."""
    from dsflash.model.kernels.fp8_gemm import bf16_gemm, fp32_gemm

    for name, (n, k) in {"router": (48, 5120), "head": (129280, 5120), "compressor_wkv": (1024, 5120)}.items():
        weight = (torch.randn(n, k, device="cuda") / 64).to(torch.bfloat16)
        dense = weight.float()
        for m in (6, 48):
            x = torch.randn(m, k, device="cuda")
            t = graph_time(lambda: bf16_gemm(x, weight))
            t_torch = graph_time(lambda: x @ dense.T)
            ref = x.double() @ dense.double().T
            err = ((bf16_gemm(x, weight).double() - ref).abs().max() / ref.abs().max()).item()
            record("kernel_bf16_gemm", f"{name}_M{m}", {"us": t * 1e6, "ratio_to_roofline": t / (2 * n * k / HBM_BPS),
                                                         "torch_fp32_us": t_torch * 1e6, "max_rel_error": err})
    fn = torch.randn(24, 4 * 5120, device="cuda") / 128  # an mHC site's mix projection
    for m in (6, 11):
        x = torch.randn(m, 4 * 5120, device="cuda")
        t, t_torch = graph_time(lambda: fp32_gemm(x, fn)), graph_time(lambda: x @ fn.T)
        ref = x.double() @ fn.double().T
        err = ((fp32_gemm(x, fn).double() - ref).abs().max() / ref.abs().max()).item()
        record("kernel_fp32_gemm", f"mhc_mix_M{m}", {"us": t * 1e6, "ratio_to_roofline": t / (4 * fn.numel() / HBM_BPS),
                                                     "torch_fp32_us": t_torch * 1e6, "max_rel_error": err})


# Prefill-form tile choices timed by attention_kernels: (keys per step, query parts,
# probability parts, warps, keys gathered first); the first is PREFILL_TILES.
PREFILL_ATTENTION_TILES = [(16, 2, 2, 4, 1), (16, 2, 2, 4, 0), (32, 2, 2, 4, 1), (16, 2, 2, 8, 1)]


def key_bytes(rows: int, dim: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic attention keys, as the pool stores them: `rows` FP8 window rows (codes, then
    e8m0 scales 2^-7: keys up to 3.5) and `rows` FP4 entries (packed e2m1, then e4m3 scales
    0.5-1.9); byte offsets of row r: r * dim and rows * dim + r * dim / 32 in the first,
    r * dim / 2 and rows * dim / 2 + r * dim / 16 in the second."""
    ring = torch.randint(0, 0x77, (rows * (dim + dim // 32),), dtype=torch.uint8, device=dev)
    ring[rows * dim:] = 120
    pages = torch.randint(0, 255, (rows * (dim // 2 + dim // 16),), dtype=torch.uint8, device=dev)
    pages[rows * dim // 2:] = torch.randint(0x30, 0x40, (rows * dim // 16,), dtype=torch.uint8, device=dev)
    return ring, pages


def attention_kernels(sizes=(6, 48, 192, 2048, 8192)) -> None:
    """Sparse attention at the release's shapes: the decode form (flash decoding, tf32x3) at
    every size, the prefill form (bf16 tensor cores) from 2,048 queries on, each tile choice
    against the decode form's output (fp32-accurate) and the FLOP roofline."""
    from dsflash.model.kernels.sparse_attention import sparse_attention

    dev = "cuda"
    heads, D, W, K = 64, 512, 128, 512
    rows = 1 << 16
    ring, pages = key_bytes(rows, D, dev)
    for n in sizes:
        q = torch.randn(n, heads, D, device=dev)
        w_off = torch.randint(0, rows, (n, W), device=dev) * D
        w_soff = rows * D + torch.randint(0, rows, (n, W), device=dev) * (D // 32)
        e_off = torch.randint(0, rows, (n, K), device=dev) * 256
        e_soff = rows * 256 + torch.randint(0, rows, (n, K), device=dev) * 32
        sink = torch.zeros(heads, device=dev)
        nbytes = n * (W * (D + D // 32) + K * 288 + heads * D * 4 * 2)
        flops = 4 * n * heads * (W + K) * D
        args = (q, ring, w_off, w_soff, pages, e_off, e_soff, sink, D**-0.5)
        iters = 3 if n > 1000 else 20
        ref = sparse_attention(*args, 4, None, 16, prefill=False)
        shapes = [("decode", dict(num_warps=4, head_block=16, prefill=False))]
        if n < 1000:
            shapes.append(("decode", dict(num_warps=8, head_block=16, prefill=False)))
            # the tensor-core form decode takes (DECODE_KEY_SPLITS), at other key splits: at 6
            # queries 4 splits are 48 programs on 132 SMs (twenty-fourth session's profile)
            shapes += [("tensor_cores", dict(prefill=True, entry_splits=s)) for s in (4, 8, 12)]
        else:
            shapes += [("prefill", dict(prefill=True, tiles=dict(KT=kt, QP=qp, PP=pp, num_warps=w, GATHER=g)))
                       for kt, qp, pp, w, g in PREFILL_ATTENTION_TILES]
        for form, kw in shapes:
            label = f"n{n}_{form}_" + "_".join(f"{k}{v}" for k, v in (kw.get("tiles") or kw).items())
            try:
                run = lambda: sparse_attention(*args, **kw)  # noqa: E731
                t = graph_time(run) if n < 1000 else cuda_time(run, iters=iters)  # decode sizes as a step runs them
                got = run()
            except Exception as exc:  # registers or shared memory the compiler cannot fit
                record("kernel_sparse_attention", label, {"error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                continue
            record("kernel_sparse_attention", label,
                   {"us": t * 1e6, "TFLOPs": flops / t / 1e12, "ratio_to_bf16_roofline": t / (flops / BF16_FLOPS),
                    "ratio_to_byte_roofline": t / (nbytes / HBM_BPS),
                    "max_rel_diff_vs_decode_form": ((got - ref).abs().max() / ref.abs().max()).item()})


def index_key_pages(entries: int, dev: str, spread: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index keys as a pool holds them (64 packed FP4 bytes, then 4 e8m0 scales at 2^-7, so no
    key overflows; with `spread`, each block's from 2^-7 up to that many binades lower, as the
    FP8 form shifts a key's blocks under its largest) and each key's byte offsets."""
    page_bytes = torch.randint(0, 255, (entries * 68,), dtype=torch.uint8, device=dev)
    page_bytes[entries * 64:] = torch.randint(120 - spread, 121, (entries * 4,), dtype=torch.uint8, device=dev)
    return page_bytes, torch.arange(entries, device=dev) * 64, entries * 64 + torch.arange(entries, device=dev) * 4


def top_k_timings(scores: torch.Tensor, k: int, label: str, timer=cuda_time) -> None:
    """The torch top-k and the kernels' (at each digit width) on the same scores. The kernels
    read the scores once per pass, 32 / bits counting passes and one writing pass: their byte
    limit is that many reads at HBM speed (rows that fit in the 50 MB L2 can beat it); the
    torch form's is one read (it sorts int64 keys: several times that in fact)."""
    from dsflash.model.kernels.top_k import top_k_ascending_kernel, top_k_ascending_ref

    nbytes = scores.numel() * 4
    want = top_k_ascending_ref(scores, k)
    t = timer(lambda: top_k_ascending_ref(scores, k))
    record("kernel_indexer_prefill", f"{label}_top_k_ascending",
           {"us": t * 1e6, "GBps_of_scores": nbytes / t / 1e9, "roofline_us": nbytes / HBM_BPS * 1e6})
    for bits in (11, 8, 6):
        def kernel():
            return top_k_ascending_kernel(scores, k, radix_bits=bits)

        passes = math.ceil(32 / bits) + 1
        t = timer(kernel)
        record("kernel_indexer_prefill", f"{label}_top_k_kernel_r{bits}",
               {"us": t * 1e6, "passes": passes, "GBps_of_scores": nbytes / t / 1e9,
                "roofline_us": passes * nbytes / HBM_BPS * 1e6, "ratio_to_roofline": t / (passes * nbytes / HBM_BPS),
                "matches_ref": torch.equal(kernel(), want)})


def indexer_kernels(tiles: tuple[tuple[int, int, int], ...] = (), fp8_only: bool = False) -> None:
    """A prefill chunk's indexer at long context: the scores of one top-k chunk (the
    _SCORE_BUDGET: 128 queries over 1M entries), in fp32 (three TF32 passes) and with
    FP4-quantized queries in one bf16 pass, in decode-sized and tall tiles (and `tiles`:
    more (queries, entries, warps) a program), then the top-k that follows them (torch and
    kernel); the top-k also at decode shapes, in CUDA graphs: the index top-k at 256K entries
    and the candidate blocks (N/8 of 512K). The FP8 tall tiles also with the queries encoded
    before (fp8_queries, as a long run's slices take them) and that encode alone (one launch,
    and torch's passes). fp8_only
    (section indexer_fp8): the bf16 and FP8 tall tiles and `tiles` in FP8, no top-k."""
    from dsflash.model.kernels import indexer_score, indexer_score_gluon
    from dsflash.model.kernels.indexer_score import indexer_scores
    from dsflash.model.kernels.top_k import top_k_ascending
    from dsflash.model.quant import fake_quant_fp4

    dev, heads, dim = "cuda", 32, 128
    for entries, n in ((1 << 20, 128), (1 << 14, 2048)):
        page_bytes, k_off, k_soff = index_key_pages(entries, dev, spread=4)  # (since the 41st session)
        q = fake_quant_fp4(torch.randn(n, heads, dim, device=dev), 32)
        w = torch.randn(n, heads, device=dev)
        visible = torch.full((n,), entries, device=dev)
        flops = 2 * n * heads * dim * entries
        ref = indexer_scores(q, w, visible, page_bytes, k_off, k_soff)
        indexer_score.TALL_FP8 = True
        encoded = indexer_score.fp8_queries(q, w)
        for label, encode in (("fp8_queries", indexer_score.fp8_queries), ("fp8_queries_torch", indexer_score.fp8_queries_ref)):
            t = cuda_time(lambda: encode(q, w), iters=5)
            record("kernel_indexer_prefill", f"N{entries}_n{n}_{label}",
                   {"us": t * 1e6, "ratio_to_hbm": t / (q.numel() * 5 / HBM_BPS)})  # fp32 in, e4m3 out
        variants = (("bf16_tall", dict(exact_in_bf16=True, tall=True)),
                    ("fp8_tall", dict(exact_in_bf16=True, tall=True, fp8=True)),
                    ("fp8_tall_encoded", dict(exact_in_bf16=True, tall=True, fp8=True, encoded=True)),
                    *((f"fp8_tall_encoded_gluon_{qb}x{nb}", dict(exact_in_bf16=True, tall=True, fp8=True, encoded=True,
                                                                 gluon=(qb, nb)))
                      for qb, nb in ((64, 128), (64, 64), (128, 64))))
        if fp8_only:
            variants += tuple((f"fp8_{qb}x{nb}_w{warps}_encoded", dict(exact_in_bf16=True, tiles=(qb, nb, warps),
                                                                      fp8=True, encoded=True))
                              for qb, nb, warps in tiles)
        else:
            variants = (("tf32x2", {}), ("bf16", dict(exact_in_bf16=True)), *variants,
                        ("bf16_tall_query_pointers", dict(exact_in_bf16=True, tall=True, tma=False)),
                        *((f"bf16_{qb}x{nb}_w{warps}", dict(exact_in_bf16=True, tiles=(qb, nb, warps)))
                          for qb, nb, warps in ((128, 128, 8),) + tuple(tiles)))
        shipped_tile = indexer_score_gluon.QUERIES, indexer_score_gluon.ENTRIES  # (restored after each variant)
        for label, kw in variants:
            def score(kw=kw):
                kw = dict(kw)
                indexer_score.QUERY_TILES_BY_TMA = kw.pop("tma", True)
                gluon = kw.pop("gluon", None)
                indexer_score.GLUON_TALL = gluon is not None
                indexer_score_gluon.QUERIES, indexer_score_gluon.ENTRIES = gluon or shipped_tile
                indexer_score.TALL_FP8 = kw.get("fp8", False)
                qw = encoded if kw.get("encoded") else (q, w)
                return indexer_scores(*qw, visible, page_bytes, k_off, k_soff, **kw)

            t, got = cuda_time(score, iters=5), score()
            indexer_score.QUERY_TILES_BY_TMA, indexer_score.TALL_FP8, indexer_score.GLUON_TALL = True, False, False
            indexer_score_gluon.QUERIES, indexer_score_gluon.ENTRIES = shipped_tile
            figures = {"us": t * 1e6, "TFLOPs": flops / t / 1e12, "ratio_to_bf16_roofline": t / (flops / BF16_FLOPS),
                       "max_rel_diff": ((got - ref).abs().max() / ref.abs().max()).item()}
            if label == "bf16_tall":
                bf16_tall = got
            if label == "fp8_tall_encoded":
                triton_fp8 = got
            if label.startswith("fp8_tall_encoded_gluon"):  # (indexer_score_gluon: the Triton tiles' scores bit for bit)
                figures["equal_to_fp8_tall_encoded"] = torch.equal(got, triton_fp8)
            if label.startswith("fp8"):  # the bf16 tiles' scores bit for bit wherever the FP8 MMA sums exactly
                figures.update(ratio_to_fp8_roofline=t / (flops / FP8_FLOPS),
                               equal_to_bf16_tall=torch.equal(got, bf16_tall),
                               max_rel_diff_to_bf16_tall=((got - bf16_tall).abs().max() / bf16_tall.abs().max()).item(),
                               rows_with_bf16_tall_top_k=(top_k_ascending(got, 512) == top_k_ascending(bf16_tall, 512)
                                                          ).all(1).float().mean().item())
            record("kernel_indexer_prefill", f"N{entries}_n{n}_{label}", figures)
        for rows in () if fp8_only else (32, n):
            top_k_timings(ref[:rows], 512, f"N{entries}_n{rows}", lambda fn: cuda_time(fn, iters=5))
    for rows, entries, k in () if fp8_only else ((6, 1 << 18, 512), (48, 1 << 16, 2048)):
        top_k_timings(torch.randn(rows, entries, device=dev), k, f"decode_N{entries}_n{rows}", graph_time)


def kernels() -> None:
    from dsflash.model.kernels.fp4_moe import fp4_moe
    from dsflash.model.kernels.fp8_gemm import fp8_gemm
    from dsflash.model.kernels.indexer_score import indexer_scores
    from dsflash.model.quant import dequantize_fp8_weight

    dev = "cuda"
    for name, (n, k) in {"wq_b": (32768, 1280), "wo_b": (5120, 8192), "wo_a_group": (1024, 4096),
                         "shared_w1": (2304, 5120)}.items():
        codes = torch.randint(0, 0x77, (n, k), dtype=torch.uint8, device=dev)
        scales = torch.full((n // 32, k // 32), 120, dtype=torch.uint8, device=dev)
        nbytes = n * k + scales.numel()
        for m in (6, 48, 192):
            x = torch.randn(m, k, device=dev)
            t = graph_time(lambda: fp8_gemm(x, codes, scales, small=True))
            t_eager = cuda_time(lambda: x @ dequantize_fp8_weight(codes, scales).T, iters=5)
            record("kernel_fp8_gemm", f"{name}_M{m}", {"us": t * 1e6, "GBps": nbytes / t / 1e9,
                                                        "roofline_us": nbytes / HBM_BPS * 1e6,
                                                        "ratio_to_roofline": t / (nbytes / HBM_BPS),
                                                        "eager_dequant_matmul_us": t_eager * 1e6})
        skinny_tiles(name, codes, scales, nbytes)
        if name in ("wq_b", "wo_b"):  # a prefill chunk: tensor-core bound, tile shapes compared
            x = torch.randn(8192, k, device=dev)
            ref = x @ dequantize_fp8_weight(codes, scales).T
            flops = 2 * 8192 * n * k
            for tiles in [None, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=4),
                          dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3),
                          dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=3),
                          dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)]:
                try:
                    t = cuda_time(lambda: fp8_gemm(x, codes, scales, tiles=tiles), iters=5)
                    err = ((fp8_gemm(x, codes, scales, tiles=tiles) - ref).abs().max() / ref.abs().max()).item()
                except Exception as exc:  # a shape the compiler cannot fit
                    record("kernel_fp8_gemm", f"{name}_M8192_{tiles}", {"error": type(exc).__name__})
                    continue
                label = "default" if tiles is None else "_".join(str(v) for v in tiles.values())
                record("kernel_fp8_gemm", f"{name}_M8192_{label}", {"us": t * 1e6, "TFLOPs": flops / t / 1e12,
                                                                   "ratio_to_bf16_roofline": t / (flops / BF16_FLOPS),
                                                                   "max_rel_error": err})
    bf16_gemms()
    E, H, k = MOE_SHAPE["E"], MOE_SHAPE["H"], MOE_SHAPE["k"]
    (w13, s13, w2, s2), per_expert = random_experts(dev)
    for tokens in (6, 48, 192):
        x = torch.randn(tokens, H, device=dev)
        idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
        weights = torch.rand(tokens, k, device=dev)
        t = graph_time(lambda: fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, small=True))
        nbytes = len(torch.unique(idx)) * per_expert
        record("kernel_fp4_moe", f"T{tokens}", {"us": t * 1e6, "experts": len(torch.unique(idx)),
                                                 "GBps": nbytes / t / 1e9, "roofline_us": nbytes / HBM_BPS * 1e6,
                                                 "ratio_to_roofline": t / (nbytes / HBM_BPS)})
    attention_kernels((6, 48, 192))
    for entries in (2048, 1 << 20):
        page_bytes, k_off, k_soff = index_key_pages(entries, dev)
        for n in (6, 192):
            q = torch.randn(n, 32, 128, device=dev)
            w = torch.randn(n, 32, device=dev)
            visible = torch.full((n,), entries, device=dev)
            t = cuda_time(lambda: indexer_scores(q, w, visible, page_bytes, k_off, k_soff), iters=10)
            nbytes = entries * 68 * math.ceil(n / 16) + n * entries * 4
            flops = 2 * n * 32 * 128 * entries
            record("kernel_indexer", f"N{entries}_n{n}", {"us": t * 1e6, "GBps": nbytes / t / 1e9,
                                                          "roofline_us": max(nbytes / HBM_BPS, flops / BF16_FLOPS) * 1e6,
                                                          "ratio_to_roofline": t / max(nbytes / HBM_BPS,
                                                                                       flops / BF16_FLOPS)})


MOE_SHAPE = dict(E=48, H=5120, inter=2304, k=6)  # the bench preset's routed experts


def random_experts(dev: str) -> tuple[tuple[torch.Tensor, ...], int]:
    """Stacked packed experts of MOE_SHAPE (random codes, scale 2^-7) as fp4_moe takes them
    (codes as quad units), and one expert's bytes."""
    from dsflash.model.kernels.fp4_moe import quad_experts

    E, H, inter = MOE_SHAPE["E"], MOE_SHAPE["H"], MOE_SHAPE["inter"]
    w13 = torch.randint(0, 255, (E, 2 * inter, H // 2), dtype=torch.uint8, device=dev)
    s13 = torch.full((E, 2 * inter, H // 32), 120, dtype=torch.uint8, device=dev)
    w2 = torch.randint(0, 255, (E, H, inter // 2), dtype=torch.uint8, device=dev)
    s2 = torch.full((E, H, inter // 32), 120, dtype=torch.uint8, device=dev)
    experts = quad_experts(w13, s13, w2, s2)
    return experts, sum(t[0].numel() * t.element_size() for t in experts)


def moe_tiles(token_counts=(6, 48, 8192)) -> None:
    """The routed-expert kernels' tile shapes, swept at decode and prefill sizes (model/kernels/fp4_moe.TILES)."""
    from dsflash.model.kernels import fp4_moe as moe

    dev, E, H, k = "cuda", MOE_SHAPE["E"], MOE_SHAPE["H"], MOE_SHAPE["k"]
    (w13, s13, w2, s2), per_expert = random_experts(dev)
    default = {key: dict(value) for key, value in moe.TILES.items()}
    default_short = {key: dict(value) for key, value in moe.SHORT_TILES.items()}
    shapes = {  # (BLOCK_N, BLOCK_KU, warps, stages), BLOCK_KU in quad units (4 codes)
        "short": [(64, 64, 4, 2), (64, 32, 4, 2), (64, 128, 4, 2), (64, 64, 4, 3), (32, 64, 4, 2), (64, 64, 8, 2),
                  (128, 64, 8, 2), (128, 32, 4, 2)],
        "tall": [(64, 16, 4, 2), (64, 32, 4, 3), (128, 16, 4, 2), (128, 32, 8, 2), (128, 32, 4, 2), (128, 64, 8, 2)],
    }
    for tokens in token_counts:
        block_m = moe.block_height(tokens * k, E)
        short = moe.parts_as_columns(block_m, moe.SPLITS)
        table = moe.tile_table(block_m, moe.SPLITS)
        candidates = [dict(BLOCK_N=n, BLOCK_KU=ku, num_warps=w, num_stages=st)
                      for n, ku, w, st in shapes["short" if short else "tall"]]
        x = torch.randn(tokens, H, device=dev)
        idx = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(tokens)])
        weights = torch.rand(tokens, k, device=dev)
        nbytes = len(torch.unique(idx)) * per_expert
        ref = moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, block_m=16, small=True)
        best = None
        for tiles in candidates:
            if time_left() < 60:
                break
            table[block_m] = tiles
            try:
                got = moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, block_m, small=True)
                run = lambda: moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, block_m, small=True)  # noqa: E731
                t = cuda_time(run, iters=5) if tokens > 1000 else graph_time(run)
            except Exception as exc:  # a shape the compiler refuses (registers, shared memory)
                record("moe_tiles", f"T{tokens}_M{block_m}_{tiles}", {"error": type(exc).__name__})
                continue
            same = bool(torch.allclose(got, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item()))
            record("moe_tiles", f"T{tokens}_M{block_m}_N{tiles['BLOCK_N']}_KU{tiles['BLOCK_KU']}_w{tiles['num_warps']}_s{tiles['num_stages']}",
                   {"us": t * 1e6, "ratio_to_roofline": t / (nbytes / HBM_BPS), "matches_default": same})
            if same and (best is None or t < best[0]):
                best = (t, tiles)
        moe.TILES.update({key: dict(value) for key, value in default.items()})
        moe.SHORT_TILES.update({key: dict(value) for key, value in default_short.items()})
        if best:
            record("moe_tiles", f"T{tokens}_M{block_m}_best", {"us": best[0] * 1e6, **best[1]})
        splits, moe.SPLITS = moe.SPLITS, 2  # activations in 2 bf16 parts instead of 3: 16 significant bits
        run = lambda: moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, block_m, small=True)  # noqa: E731
        t = cuda_time(run, iters=5) if tokens > 1000 else graph_time(run)
        got = moe.fp4_moe(x, idx, weights, w13, s13, w2, s2, 10.0, block_m, small=True)
        moe.SPLITS = splits
        record("moe_tiles", f"T{tokens}_M{block_m}_splits2", {"us": t * 1e6, "max_rel_error": ((got - ref).abs().max() / ref.abs().max()).item()})


# ------------------------------------------------------------------ the model


def build_model(fast: bool, preset: str, parallel=None, act_quant: bool = False):
    from dsflash.model.checkpoint_writer import preset_config, random_weight_store
    from dsflash.model.config import ModelConfig
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.fast_ops import TritonOps
    from dsflash.model.graphs import GraphCache
    from dsflash.model.ops import ReferenceOps
    from dsflash.model.parallel import SINGLE, keeps_spec, shard_attention

    parallel = parallel or SINGLE
    began = time.monotonic()
    config = preset_config(preset)
    select = keeps_spec(ModelConfig.from_dict(config), parallel)
    store = shard_attention(random_weight_store(config, seed=0, device=DEV, select=select), parallel)
    tokenizer = pathlib.Path(os.environ.get("DSFLASH_TOKENIZER", ".bench/golden/v41-tiny-a/tokenizer.json"))
    model = DeepseekV41(store, tokenizer_json=tokenizer, device=DEV, parallel=parallel)
    model.ops = (TritonOps(store, act_quant=act_quant, device=DEV, parallel=parallel) if fast
                 else ReferenceOps(store, act_quant=act_quant, device=DEV, cache_dense=False, parallel=parallel))
    if fast and GraphCache.wanted(torch.device(DEV)):
        model.graphs = GraphCache()
    record("setup", "weights", {"seconds": time.monotonic() - began, "GiB": store.nbytes / 2**30})
    return model, store


class StepWeights(NamedTuple):
    """What a decode step's weights weigh, read from the store as loaded: the bytes every
    step reads, and each layer's routed experts' bytes, of which a step reads those routed to
    (hold_experts_once drops the per-expert tensors they are read from)."""

    dense: int
    experts: dict[str, int]  # by the layer's "{prefix}.ffn"


def step_weights(store, config) -> StepWeights:
    """The weights of a step: the embedding's rows only, the LM head twice (the verify rows',
    the drafts'), the Markov head once a draft, every other dense weight once. With a sharded
    store (--tp) one rank's: its heads and experts. Until 2026-12-04 (thirty-ninth session)
    the embedding was counted whole and the LM head three times: 33.6 GB a batch-1 step where
    31.2 is right."""
    from dsflash.model.weights import Fp4Weight, weight_nbytes

    dense = 0
    experts: dict[str, int] = {}
    for name in store.names():
        w = store[name]
        nbytes = weight_nbytes(w)
        if ".engram.embed" in name or name == "embed.weight":
            continue  # row gathers only
        if isinstance(w, Fp4Weight):
            layer = name.split(".experts.")[0]
            experts[layer] = experts.get(layer, 0) + nbytes
        else:
            dense += nbytes
        if name == "head.weight":
            dense += nbytes  # read again by the drafter's head
        if name.endswith(".markov_head.head.weight"):
            dense += (config.dspark_block_size - 1) * nbytes  # once a draft
    return StepWeights(dense, experts)


def hold_experts_once(model) -> StepWeights:
    """Stack the routed experts and drop their per-expert tensors from the model's store, as a
    serving worker holds them (DeepseekV41.use_kernels(keep_unpacked=False)); returns the
    step's weights, read before. Held twice, the bench preset's decode ran out of an 80 GB
    H100's memory (call V, fifty-first session) and its prefill too (forty-sixth). The
    reference path reads the per-expert tensors: it cannot run after."""
    weights = step_weights(model.ops.weights, model.config)
    model.ops.stack_all_experts(model.config)
    return weights


def step_bytes(weights: StepWeights, config, batch: int, context: int) -> float:
    """Bytes one decode step must read: its weights (experts only those routed to, in
    expectation), plus the KV the 6-token verify block and the 5-row draft read."""
    rows = 6 * batch
    routed = 0
    for role in config.roles:
        e, k = role.n_routed_experts, role.num_experts_per_tok
        n = rows if not role.is_dspark else 5 * batch
        touched = e * (1 - (1 - k / e) ** n)
        routed += weights.experts.get(f"{role.prefix}.ffn", 0) * touched / e
    return weights.dense + routed + kv_bytes(config, batch, context)


def kv_bytes(config, batch: int, context: int) -> int:
    """The KV a step's 6-row verify blocks read: each request's FP8 window once (its rows share
    it), each row's selected compressed entries (288 bytes; a request's rows select apart), and
    at an index source each request's index keys once (68 bytes an entry: its rows score the same
    keys). Until 2026-12-04 (thirty-ninth session) the window was counted once a row and the index
    keys once per 16 rows of the whole batch, as if one request's keys were read for every other
    request's rows: at 1M and batch 32, 229.6 GB a step where it is 66.6 (batch 8: 61.5 / 54.1)."""
    rows = 6 * batch
    kv = 0
    for role in config.roles[: config.num_layers]:
        kv += batch * config.sliding_window * (config.head_dim + config.head_dim // 32)
        if role.ratio:
            kv += rows * min(config.index_topk, context // role.ratio) * 288
        if role.is_index_source:
            kv += batch * (context // role.ratio) * 68
    return kv


def step_flops(config, batch: int, context: int) -> float:
    """Matrix FLOPs of a step's verify rows: the layers' products and the LM head, the indexer's
    scores (every row against its request's index keys at each index source) and the attention
    (every row against its window and selected entries, scores and values); the drafter's rows
    not counted. At 1M context and batch 32 their time at the bf16 rate passes the step's bytes'
    at the HBM rate."""
    rows = 6 * batch
    flops = rows * (layer_token_flops(config) * config.num_layers + 2 * config.vocab_size * config.hidden_size)
    for role in config.roles[: config.num_layers]:
        keys = config.sliding_window + (min(config.index_topk, context // role.ratio) if role.ratio else 0)
        flops += 2 * 2 * rows * config.num_heads * config.head_dim * keys
        if role.is_index_source:
            flops += 2 * rows * (context // role.ratio) * config.index_n_heads * config.index_head_dim
    return flops


def decode_engine(model, batch: int, context: int, generator: torch.Generator):
    """A decode engine holding `batch` greedy requests of `context` synthetic tokens each (with
    DSpark blocks of 5 drafts), not yet admitted: its first step admits them."""
    from dsflash.decode_worker.engine import DecodeEngine, DecodeEngineConfig
    from dsflash.decode_worker.warmup import synthetic_request
    from dsflash.kvcache.layout import CacheLayout
    from dsflash.kvcache.pool import CachePool, plain_allocator

    layout = CacheLayout.for_model(model.config, page_entries=256)
    pool = CachePool(layout, layout.pages_for(context + 64) * batch + 8, batch + 1, plain_allocator(DEV))
    engine = DecodeEngine(model, pool, DecodeEngineConfig(max_running=batch, spec_tokens=5))
    for i in range(batch):
        engine.add(synthetic_request(engine, f"r{i}", context, generator, max_tokens=100))
    return engine


def engine_arguments(parser, steps: int) -> None:
    """The options of a diagnostic that runs one decode engine (warm_engine)."""
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--act-quant", action="store_true")
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--device", default="cuda", help="cpu with --preset tiny: a smoke test (no GPU clock)")


def warm_engine(args):
    """(engine, step ms) for engine_arguments' args: a decode engine of args.batch requests at
    args.context tokens with its graphs captured and warm, and its step time over args.steps
    steps (diagnostics then rerun steps under their own instruments)."""
    global DEV
    DEV = args.device
    DEADLINE[0] = time.monotonic() + 3600
    model, _ = build_model(fast=True, preset=args.preset, act_quant=args.act_quant)
    hold_experts_once(model)
    engine = decode_engine(model, args.batch, args.context, torch.Generator(device=DEV).manual_seed(0))
    return engine, timed_steps(engine, 4, args.steps)  # admission, then capture and warm the graphs


def new_graphs(model) -> None:
    """Give the model an empty CUDA graph cache (a switch's new value is captured afresh), the
    old one's graphs freed first: left to the collector they stayed alive beside the new ones."""
    if model.graphs is not None:
        model.graphs.release()
        model.graphs = type(model.graphs)()


GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
MIN_GAP_US = 1.0  # shorter idle stretches are the GPU's own switch between kernels


def gpu_gaps(trace: dict) -> tuple[float, float, list[tuple[float, dict]]]:
    """(GPU busy us, first to last GPU work us, [(idle us, the GPU event ending it)]) of a
    Chrome trace from torch.profiler: busy is the union of every kernel, copy and set, so work
    overlapping on side streams counts once; a gap is a stretch over MIN_GAP_US with none."""
    gpu = sorted((e for e in trace["traceEvents"] if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])
    busy, end, found = 0.0, None, []
    for e in gpu:
        stop = e["ts"] + e.get("dur", 0)
        if end is not None and e["ts"] - end > MIN_GAP_US:
            found.append((e["ts"] - end, e))
        if end is None or stop > end:
            busy += stop - max(e["ts"], end if end is not None else e["ts"])
            end = stop
    return busy, (end - gpu[0]["ts"]) if gpu else 0.0, found


def chrome_trace(prof) -> dict:
    """A finished torch.profiler run as its Chrome trace (the events with their args: a
    kernel's grid, block and registers, its launch's correlation id)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def timed_steps(engine, warm: int, steps: int) -> float:
    """ms a decode step, over `steps` steps after `warm` untimed ones."""
    with torch.inference_mode():
        for _ in range(warm):
            engine.step()
        sync()
        began = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync()
    return (time.perf_counter() - began) / steps * 1e3


def decode(model, weights: StepWeights, batches, contexts, label: str) -> None:
    config = model.config
    g = torch.Generator(device=DEV).manual_seed(0)
    for context in contexts:
        for batch in batches:
            if time_left() < 60:
                record(label, f"ctx{context}_B{batch}", {"skipped": "device time budget"})
                continue
            engine = decode_engine(model, batch, context, g)
            reference = label.startswith("reference")  # admission, then 1 or 2 warm steps
            step_s = timed_steps(engine, 2 if reference else 3, 2 if reference else 6) / 1e3
            if PROFILE[0] and label.startswith("decode") and batch == batches[0]:
                profile_steps(engine, f"{label}_ctx{context}_B{batch}", stacks=True)
                host_profile(engine, f"host_{label}_ctx{context}_B{batch}")
            emitted = sum(len(r.output) for r in engine.running)
            nbytes = step_bytes(weights, config, batch, context)
            roofline = nbytes / HBM_BPS
            flop_floor = step_flops(config, batch, context) / BF16_FLOPS  # a second floor, beside the bytes'
            record(label, f"ctx{context}_B{batch}", {"step_ms": step_s * 1e3, "roofline_ms": roofline * 1e3,
                                                     "ratio_to_roofline": step_s / roofline,
                                                     "GB_per_step": nbytes / 1e9,
                                                     "bf16_flops_ms": flop_floor * 1e3,
                                                     "ratio_to_larger_floor": step_s / max(roofline, flop_floor),
                                                     "tokens_per_s_at_accept_1": batch / step_s,
                                                     "tokens_per_s_at_accept_6": 6 * batch / step_s,
                                                     "emitted": emitted})
            for r in list(engine.running):
                engine.abort(r.request_id)
            del engine
            if DEV.startswith("cuda"):
                torch.cuda.empty_cache()


def host_profile(engine, name: str, steps: int = 2) -> None:
    """Where a host-bound step's Python time goes (cProfile, by own time and by cumulative)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    with torch.inference_mode():
        profiler.enable()
        for _ in range(steps):
            engine.step()
        sync()
        profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
    (out_dir() / f"profile_{name}.txt").write_text(text.getvalue())


def profile_steps(engine, name: str, steps: int = 2, stacks: bool = False):
    """Where a step's time goes: the top operators by host and by device time; with `stacks`
    also by the Python lines that launched them (which torch ops come from which layer code).
    Returns the last step's result (a prefill run's finished requests); GPU_IDLE[name] gets
    the GPU's busy and idle time in the profiled steps (gpu_idle)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV.startswith("cuda") else [])
    # the verbose config is what makes the Python stacks show in key_averages (torch 2.11)
    config = torch._C._profiler._ExperimentalConfig(verbose=True) if stacks else None
    with torch.inference_mode(), profile(activities=activities, with_stack=stacks,
                                         experimental_config=config) as prof:
        began = time.perf_counter()
        for _ in range(steps):
            done = engine.step()
        sync()
        wall_s = time.perf_counter() - began
    table = prof.key_averages()
    text = [table.table(sort_by="self_cpu_time_total", row_limit=30)]
    if DEV.startswith("cuda"):
        GPU_IDLE[name] = gpu_idle(chrome_trace(prof), wall_s)
        text.insert(0, "\n".join(f"{k}: {v}" for k, v in GPU_IDLE[name].items()))
        text.append(table.table(sort_by="self_cuda_time_total", row_limit=20))
    if stacks:  # by device time (prefill: the GPU is the limit) and by host time (decode: the host is)
        by_stack = prof.key_averages(group_by_stack_n=4)
        for sort in ["self_cuda_time_total"] * DEV.startswith("cuda") + ["self_cpu_time_total"]:
            text.append(by_stack.table(sort_by=sort, row_limit=40, max_name_column_width=60))
    (out_dir() / f"profile_{name}.txt").write_text("\n".join(text))
    print("\n".join(t[:6000] for t in text), flush=True)
    return done


GPU_IDLE: dict[str, dict] = {}  # profile_steps' name -> gpu_idle of its steps


def gpu_idle(trace: dict, wall_s: float, top: int = 12) -> dict:
    """Where profiled steps left the GPU idle: its busy time (the union of its work) against
    their wall time (the profiler slows the host, so idle here is an upper bound: compare busy
    with an unprofiled step's wall) and against the sum of its work's times (the excess ran
    beside other work, on side streams); and the idle time before each kind of GPU work, the
    largest first (what waited on the host: a sync before it, or launches too slow to keep
    ahead)."""
    busy, span, found = gpu_gaps(trace)
    before = {}
    for us, event in found:
        name = event.get("name", "?")[:70]
        total, count = before.get(name, (0.0, 0))
        before[name] = (total + us, count + 1)
    largest = sorted(before.items(), key=lambda kv: -kv[1][0])[:top]
    work = sum(e.get("dur", 0) for e in trace["traceEvents"] if e.get("cat") in GPU_CATEGORIES)
    return {"wall_ms": round(wall_s * 1e3, 2), "gpu_busy_ms": round(busy / 1e3, 2),
            "gpu_work_ms": round(work / 1e3, 2),  # over busy: what ran beside other work (side streams)
            "first_to_last_gpu_ms": round(span / 1e3, 2),
            "idle_gaps_ms": round(sum(us for us, _ in found) / 1e3, 2), "gaps": len(found),
            "idle_before_ms": {name: [round(us / 1e3, 3), count] for name, (us, count) in largest}}


# (tokens, seconds with its warm-up, less its Triton compiles) of each prefill run so far
PREFILL_RUNS: list[tuple[int, float]] = []


def prefill_fits(n: int, left: float) -> bool:
    """Whether a prefill of n tokens should start with `left` seconds of the budget: the first
    run of a process needs 90 (its compiles); a later one 1.3x the last run's seconds less its
    compiles, scaled up to its length, plus 10. (A flat 90 s left a step of four 32K runs under a
    140 s budget one run, forty-seventh session; counting the compiles of a first run on an empty
    Triton cache, 82 s at 256K of which ~11 s prefilling, skipped the five runs after it,
    sixty-sixth session.)"""
    if not PREFILL_RUNS:
        return left >= 90
    tokens, seconds = PREFILL_RUNS[-1]
    return left >= 1.3 * seconds * max(n / tokens, 1.0) + 10


def add_no_warm_up(parser) -> None:
    """--no-warm-up: prefill runs without the warm-up prompts first (a run compiles what it meets:
    compare the later runs). On a fresh machine's empty Triton cache the warm-up outlasted a
    240 s step (H100, sixty-fifth session)."""
    parser.add_argument("--no-warm-up", action="store_true",
                        help="prefill: no warm-up prompts first (the first run compiles what it meets; "
                             "compare the later runs)")


def prefill(model, lengths, label: str = "prefill", warm_first: bool = True, chunk: int = 8192) -> None:
    from dsflash.kvcache.layout import CacheLayout
    from dsflash.kvcache.pool import CachePool, plain_allocator
    from dsflash.prefill_worker.engine import PrefillEngine, PrefillEngineConfig, PrefillRequest
    from dsflash.prefill_worker.scheduler import PrefillSchedulerConfig

    config = model.config
    layout = CacheLayout.for_model(config, page_entries=256)
    # chunk: tokens a prefill step takes (the scheduler's token budget; the workers' default)
    for n in lengths:
        if not prefill_fits(n, time_left()):
            record(label, f"T{n}", {"skipped": "device time budget"})
            continue
        run_began, compiles_at_start = time.perf_counter(), len(COMPILES)
        # compile the GPU kernels for prefill shapes first. A prompt up to 64K is prefilled whole
        # once: a full chunk and a part did not cover every shape of the later chunks, and a run
        # on a machine whose Triton cache lacked them timed their compiles (seventh session: a
        # 32K faithful prefill 6.14 s, then 3.47 s on the same machine). Longer prompts warm
        # on a chunk and a part, as a prefill worker does at start (PrefillEngine.warm_up: two
        # prompts, whose last entry counts 16 divides and does not).
        warm = 0
        if warm_first and DEV.startswith("cuda") and (n == lengths[0] or n <= 65536):
            warm = n if n <= 65536 else chunk + 2048
        if warm and n > 65536:  # the long prompts' indexer kernels, as a worker compiles them at start
            from dsflash.model.layers import indexer

            began = time.perf_counter()
            indexer.warm_up(torch.device(DEV), config, layout, faithful=model.ops.act_quant)
            sync()
            record(label, f"T{n}_indexer_warm_up", {"seconds": time.perf_counter() - began})
        pool = CachePool(layout, layout.pages_for(max(n, warm)) + 8, 2, plain_allocator(DEV))
        engine = PrefillEngine(model, pool, PrefillEngineConfig(PrefillSchedulerConfig(token_budget=chunk, max_chunk=chunk),
                                                                ced=True))
        if warm:
            with torch.inference_mode():
                engine.warm_up(warm)
        # one prompt a length: variants of a run prefill the same tokens, so their last logits compare
        prompt = torch.randint(3, 100000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        engine.add(PrefillRequest("p", prompt, want_taps=False))
        sync()
        if DEV.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        print(f"[{label}] T{n}: the timed run begins", flush=True)  # compiles after this line missed the warm-up
        compiled_before = len(COMPILES)
        began = time.perf_counter()
        progress = []  # (tokens done, seconds) every ~64K tokens: how a chunk's cost grows with the context
        # --profile and a prompt past 64K: its last chunk is profiled in the run (the indexer and
        # top-k grow with the context; the first chunk's profile below does not show them). Its
        # time then includes the profiler's overhead, so the record says so.
        profile_last = PROFILE[0] and n > 65536
        last_steps = []  # the last steps' seconds: the last one also runs the CED decoder pass
        with torch.inference_mode():
            while engine.has_work():
                step_began = time.perf_counter()
                if profile_last and engine.queued_tokens <= chunk:
                    done = profile_steps(engine, f"prefill_last_chunk_T{n}", steps=1)
                else:
                    done = engine.step()
                if engine.queued_tokens <= 2 * chunk:
                    sync()
                    last_steps.append(round(time.perf_counter() - step_began, 3))
                if (n - engine.queued_tokens) // 65536 > len(progress) - 1:
                    sync()
                    progress.append((n - engine.queued_tokens, round(time.perf_counter() - began, 2)))
                if time_left() < 30:
                    break
        sync()
        seconds = time.perf_counter() - began
        if engine.has_work():
            record(label, f"T{n}", {"aborted_after_s": seconds, "done_tokens": n - engine.queued_tokens,
                                        "progress": progress})
            continue
        flops = prefill_flops(model, n)
        limit = prefill_limit_s(config, n, model.ops.act_quant)
        logits = done[0].output.logits if done and done[0].output is not None else torch.zeros(1)
        record(label, f"T{n}", {"seconds": seconds, "tokens_per_s": n / seconds, "profiled_last_chunk": profile_last,
                                    "last_logits_sum": repr(logits.double().sum().item()),
                                    "last_argmax": int(logits.argmax()),
                                    "limit_s": limit, "ratio_to_limit": seconds / limit,
                                    "roofline_s_bf16": flops / BF16_FLOPS, "ratio_to_roofline": seconds / (flops / BF16_FLOPS),
                                    "TFLOP": flops / 1e12, "progress": progress, "last_steps_s": last_steps,
                                    "peak_GiB": peak_gib(), **compiles_since(compiled_before),
                                    **({"last_chunk_gpu": GPU_IDLE.get(f"prefill_last_chunk_T{n}")}
                                       if profile_last else {})})
        done[0].cache.release()
        compiling = compiles_since(compiles_at_start)["compile_s_inside"]
        PREFILL_RUNS.append((n, time.perf_counter() - run_began - compiling))
        if PROFILE[0] and n == lengths[0]:  # one chunk after a warm one, into a new cache
            # two chunks: the first warms, the second is profiled (a prompt of one chunk left
            # the profiled step nothing to do: 16,384-token chunks, nineteenth session)
            engine.add(PrefillRequest("profiled", torch.randint(3, 100000, (2 * chunk,)).tolist(), want_taps=False))
            with torch.inference_mode():
                engine.step()
            profile_steps(engine, f"{label}_chunk{chunk}", steps=1, stacks=True)
            if DEV.startswith("cuda"):
                record(label, f"T{n}_profiled_second_chunk_gpu", GPU_IDLE[f"{label}_chunk{chunk}"])
        del engine, pool
        if DEV.startswith("cuda"):
            torch.cuda.empty_cache()


def compiles_since(first: int) -> dict:
    """The Triton compiles noted since COMPILES held `first`: how many, their seconds, which
    kernels (a timed run's own should be none)."""
    inside = COMPILES[first:]
    return {"compiles_inside": len(inside), "compile_s_inside": round(sum(took for took, _ in inside), 2),
            "compiled_kernels": sorted({kernel for _, kernel in inside})}


def peak_gib() -> float:
    """GiB the run held at most on the GPU since the last reset_peak_memory_stats (0 on the CPU)."""
    return torch.cuda.max_memory_allocated() / 2**30 if DEV.startswith("cuda") else 0.0


def layer_token_flops(c) -> float:
    """Matrix FLOPs of one token through a layer's projections and experts: 2 x the parameters it touches."""
    attn = 2 * (c.q_lora_rank * c.hidden_size + c.num_heads * c.head_dim * c.q_lora_rank + c.head_dim * c.hidden_size
                + c.o_groups * c.o_lora_rank * c.num_heads * c.head_dim // c.o_groups
                + c.hidden_size * c.o_groups * c.o_lora_rank)
    ffn = 2 * 3 * c.moe_intermediate_size * c.hidden_size * (c.num_experts_per_tok + 1)
    return attn + ffn


def prefill_flops(model, n: int) -> float:
    """Matrix FLOPs of a CED prefill (prefill_flop_parts, summed)."""
    return sum(prefill_flop_parts(model.config, n).values())


def prefill_flop_parts(c, n: int) -> dict[str, float]:
    """Matrix FLOPs of a CED prefill by kind: encoder layers over every token, decoder over the
    tail; the products (2 * params touched per token), the attention and the indexer (queries x
    visible keys). Layer 20 (the split) runs only its KV-source path (the compressor) over every
    token: its indexer and attention run on the tail, with the decoder, and are not counted (they
    were until 2026-12-01, ninth session: 4.6 of 28.6 PFLOP at 1M: a 41.3 s roofline where it is 34.6 s)."""
    parts = {"products": layer_token_flops(c) * c.ced_split * n, "attention": 0.0, "indexer": 0.0}
    for role in c.roles[: c.ced_split]:
        if role.ratio:
            parts["attention"] += 2 * c.num_heads * c.head_dim * 2 * (c.sliding_window + min(c.index_topk, n // role.ratio)) * n
        if role.is_index_source:
            parts["indexer"] += 2 * c.index_n_heads * c.index_head_dim * n * (n // role.ratio) / 2
    return parts


def prefill_limit_s(c, n: int, act_quant: bool) -> float:
    """A prefill's FLOP floor at the rates its kinds run at: faithful mode's products on the FP8
    tensor cores (1,276 TFLOP/s) where prefill_gemms sends them there, its indexer's scores too
    where indexer_score.TALL_FP8 is on; the rest (and exact mode's fp32-input products) at the
    bf16 rate. Until 2026-12-04 (thirty-ninth session) every prefill was held to the bf16 rate:
    faithful 1M against 34.6 s, where its FP8 products make the floor 24.3 s."""
    from dsflash.model.kernels import indexer_score, prefill_gemms

    parts = prefill_flop_parts(c, n)
    fp8 = {"products": act_quant and prefill_gemms.FP8_TENSOR_CORES,
           "indexer": act_quant and indexer_score.TALL_FP8, "attention": False}
    return sum(flops / (FP8_FLOPS if fp8[kind] else BF16_FLOPS) for kind, flops in parts.items())


def tensor_parallel_rank(rank: int, world: int, rendezvous: str, contexts, batches, preset: str,
                         prefill_lengths=(), act_quant: bool = False) -> None:
    """One rank of a `--tp` run: every rank steps the same engine on the same inputs (SPMD);
    rank 0 reports. No time-budget checks here: ranks must take the same branches."""
    from dsflash.model.parallel import init_parallel

    global DEV
    DEV = f"cuda:{rank}" if torch.cuda.is_available() else "cpu"  # cpu: a gloo smoke test of this path
    if DEV != "cpu":
        torch.cuda.set_device(rank)
    parallel = init_parallel(rank, world, rendezvous, DEV)
    watch_compiles()
    if rank:
        REPORTING[0] = False
    DEADLINE[0] = float("inf")
    model, _ = build_model(fast=True, preset=preset, parallel=parallel, act_quant=act_quant)
    weights = hold_experts_once(model)
    mode = "_act_quant" if act_quant else ""
    for context in contexts:
        decode(model, weights, batches, [context], f"decode_tp{world}{mode}")
    if prefill_lengths:
        prefill(model, prefill_lengths, f"prefill_tp{world}{mode}")
    model.release_graphs()  # before NCCL's teardown, which waits on the collectives they captured
    torch.distributed.destroy_process_group()


def main() -> None:
    global DEV
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="kernels,decode,reference,prefill")
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument("--prefill", default="32768")
    parser.add_argument("--chunk", type=int, default=8192,
                        help="tokens a prefill step takes (a prefill worker's default is 16384: "
                             "scheduler.PREFILL_WORKER_TOKEN_BUDGET)")
    parser.add_argument("--prefill-switch", default="",
                        help="'package.module.ATTR=V1|V2|..': the prefill section once with each value (Python "
                             "literals); several switches joined by ';' take their i-th values together")
    add_no_warm_up(parser)
    parser.add_argument("--weight-cache-bytes", default="0",
                        help="prefill: comma-separated budgets, each in turn, for faithful mode's weights kept "
                             "re-encoded for the FP8 tensor cores (TritonOps.keep_encoded_weights; 0: none)")
    parser.add_argument("--contexts", default="4096,1048576")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--profile", action="store_true", help="profile two decode steps of the first batch size")
    parser.add_argument("--tp", type=int, default=1, help="ranks for tensor/expert parallel decode (GPUs)")
    parser.add_argument("--reference-prefill", type=int, default=4096,
                        help="with the reference section: a prefill of this many tokens on both paths (0: none)")
    parser.add_argument("--moe-tokens", default="6,48,8192", help="token counts the moe_tiles section sweeps")
    parser.add_argument("--indexer-tiles", default="",
                        help="';'-separated queries,entries,warps a program the indexer section also times")
    parser.add_argument("--act-quant", action="store_true",
                        help="faithful mode: FP8-round every FP8/FP4 GEMM input (sections get an _act_quant suffix)")
    args = parser.parse_args()
    DEV = args.device
    DEADLINE[0] = time.monotonic() + args.budget_s
    PROFILE[0] = args.profile
    watch_compiles()
    if args.profile:  # with PDL a kernel's programs wait inside it: the profile would overstate kernels
        from dsflash.model.kernels import pdl
        pdl.ENABLED = False
        print("[profile] programmatic dependent launch off for this run (model/kernels/pdl.py)", flush=True)
    sections = args.sections.split(",")
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    record("setup", "device", {"name": torch.cuda.get_device_name() if DEV.startswith("cuda") else "cpu",
                               "torch": torch.__version__})
    if args.tp > 1:
        import tempfile

        import torch.multiprocessing as mp

        rendezvous = f"file://{tempfile.mkdtemp()}/rendezvous"
        lengths = [int(x) for x in args.prefill.split(",")] if "prefill" in sections else []
        mp.start_processes(tensor_parallel_rank,
                           args=(args.tp, rendezvous, contexts, batches, args.preset, lengths, args.act_quant),
                           nprocs=args.tp, join=True, start_method="spawn")
        return
    if DEV.startswith("cuda"):
        ceilings()
    if "kernels" in sections and DEV.startswith("cuda"):
        kernels()
    if "decode_gemms" in sections and DEV.startswith("cuda"):
        decode_gemms()
    if "attention" in sections and DEV.startswith("cuda"):
        attention_kernels((192, 8192))
    if {"attention", "indexer", "indexer_fp8"} & set(sections) and DEV.startswith("cuda"):
        indexer_kernels(tuple(tuple(int(v) for v in t.split(",")) for t in args.indexer_tiles.split(";") if t),
                        fp8_only="indexer_fp8" in sections and not {"attention", "indexer"} & set(sections))
    if "moe_tiles" in sections and DEV.startswith("cuda"):
        moe_tiles([int(x) for x in args.moe_tokens.split(",")])
    if {"decode", "prefill", "reference"} & set(sections):
        model, store = build_model(fast=True, preset=args.preset, act_quant=args.act_quant)
        # the reference path reads the per-expert tensors; every other section runs on the
        # experts held once, as a worker holds them
        weights = step_weights(store, model.config) if "reference" in sections else hold_experts_once(model)
        mode = "_act_quant" if args.act_quant else ""
        if "decode" in sections:
            for context in contexts:
                decode(model, weights, batches, [context], "decode" + mode)
        if "decode_eager" in sections:  # the same kernels without CUDA graphs: what the graphs buy
            graphs, model.graphs = model.graphs, None
            decode(model, weights, [batches[0]], [contexts[0]], "decode_eager" + mode)
            model.graphs = graphs
        if "prefill" in sections:
            lengths = [int(x) for x in args.prefill.split(",")]
            switches = [module_switch(path, values.split("|"))
                        for path, values in (one.split("=", 1) for one in args.prefill_switch.split(";") if one)]
            assert len({len(values) for _, _, values in switches}) <= 1, "every switch takes as many values"
            for cache in (int(float(v)) for v in args.weight_cache_bytes.split(",")):
                model.ops.keep_encoded_weights(cache)  # (its first run, a warm-up, fills it)
                chunk = ("" if args.chunk == 8192 else f"_chunk{args.chunk}") + (f"_weights_kept{cache / 2**30:g}GiB"
                                                                                 if cache else "")
                if switches:  # each value in turn, in one process: the records' last logits compare
                    for i in range(len(switches[0][2])):
                        for module, attribute, values in switches:  # variant i: each switch's i-th value
                            setattr(module, attribute, values[i])
                        label = ",".join(f"{attribute}={values[i]!r}" for _, attribute, values in switches)
                        prefill(model, lengths, f"prefill{mode}{chunk}_{i}_{label}",
                                warm_first=not args.no_warm_up, chunk=args.chunk)
                else:
                    prefill(model, lengths, "prefill" + mode + chunk, warm_first=not args.no_warm_up,
                            chunk=args.chunk)
            model.ops.keep_encoded_weights(0)
        if "reference" in sections:
            from dsflash.model.ops import ReferenceOps

            n = args.reference_prefill
            # the fast path's prefill of the same length first, the second of two timed (the
            # first compiles kernels for its shapes): the speedup, in one run
            if n:
                prefill(model, [n], "prefill_compiling" + mode)
                prefill(model, [n], "prefill_beside_reference" + mode, warm_first=False)
            model.ops, model.graphs = ReferenceOps(store, act_quant=args.act_quant, device=DEV, cache_dense=False), None
            decode(model, weights, [1], [contexts[0]], "reference" + mode)
            if n:
                prefill(model, [n], "reference_prefill" + mode, warm_first=False)
    print(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
    main()
