"""Tensor-parallel attention + expert-parallel MoE (model/parallel.py): W real processes joined
over gloo (CI, CPU) or NCCL (2+ GPUs) reproduce one process's logits and greedy tokens on the
golden checkpoint, and each rank holds only its share of the weights."""

from __future__ import annotations

import pathlib

import pytest
import torch
import torch.multiprocessing as mp

from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.kernels.fp4_moe import fp4_moe, fp4_moe_ref, quad_experts
from dsflash.model.parallel import Parallel, check_divisible, check_fits, init_parallel, rank_bytes
from dsflash.model.tensor_spec import model_tensors
from dsflash.model.weights import Checkpoint
from dsflash.model.quant import quantize_fp4_weight
from dsflash.model.runner import greedy, prompt_logits

GREEDY_STEPS = 6


def _rank_main(rank: int, world: int, golden_dir: str, store_dir: str, device_kind: str, prompts: list) -> None:
    device = f"cuda:{rank}" if device_kind == "cuda" else "cpu"
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
    parallel = init_parallel(rank, world, f"file://{store_dir}/rendezvous", device)
    model = DeepseekV41.from_checkpoint(golden_dir, device=device, parallel=parallel)
    if device_kind == "cuda":
        model.use_kernels()
    with torch.inference_mode():
        out = {"logits": [prompt_logits(model, ids, "full").cpu() for ids in prompts],
               "greedy": greedy(model, prompts[0], GREEDY_STEPS),
               "experts": sorted({n.split(".experts.")[1].split(".")[0] for n in model.ops.weights.names()
                                  if n.startswith("layers.0.ffn.experts.")}, key=int),
               "wq_b_rows": model.ops.weights["layers.0.attn.wq_b"].shape[0]}
    torch.save(out, f"{store_dir}/rank{rank}.pt")
    model.release_graphs()  # before NCCL's teardown, which waits on the collectives they captured
    torch.distributed.destroy_process_group()


def _run_ranks(world: int, golden_dir, tmp_path: pathlib.Path, device_kind: str, prompts) -> list[dict]:
    mp.start_processes(_rank_main, args=(world, str(golden_dir), str(tmp_path), device_kind, prompts),
                       nprocs=world, join=True, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _check_against_one_process(results, golden_dir, prompts, device: str, tolerance: float):
    single = DeepseekV41.from_checkpoint(golden_dir, device=device)
    if device != "cpu":
        single.use_kernels()
    with torch.inference_mode():
        want = [prompt_logits(single, ids, "full").cpu() for ids in prompts]
        want_greedy = greedy(single, prompts[0], GREEDY_STEPS)
    for r in results:
        for got, ref in zip(r["logits"], want):
            assert torch.equal(got.argmax(-1), ref.argmax(-1))
            d = (got - ref).abs().max()
            assert d <= tolerance, f"max |logit difference| {d:.3g} > {tolerance}"
        assert r["greedy"] == want_greedy
    for got in results[1:]:  # an all-reduce hands every rank the same sums
        d = max((a - b).abs().max() for a, b in zip(got["logits"], results[0]["logits"]))
        assert d == 0, f"ranks disagree by {d:.3g}"


def test_two_ranks_over_gloo_match_one_process(golden_dir, golden, tmp_path):
    prompts = [g["input_ids"] for g in golden[:2]]
    results = _run_ranks(2, golden_dir, tmp_path, "cpu", prompts)
    config = DeepseekV41.from_checkpoint(golden_dir).config
    experts = config.roles[0].n_routed_experts
    assert [r["experts"] for r in results] == [[str(e) for e in range(experts // 2)],
                                               [str(e) for e in range(experts // 2, experts)]]
    assert all(r["wq_b_rows"] == config.num_heads // 2 * config.head_dim for r in results)
    _check_against_one_process(results, golden_dir, prompts, "cpu", 1e-4)


@pytest.mark.gpu
def test_two_gpus_over_nccl_with_kernels_match_one_gpu(golden_dir, golden, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    prompts = [g["input_ids"] for g in golden[:2]]
    results = _run_ranks(2, golden_dir, tmp_path, "cuda", prompts)
    # the golden bar: TF32x3 dots and split-K sums over other shapes move logits by ~1e-3 (measured 1.5e-3)
    _check_against_one_process(results, golden_dir, prompts, "cuda", 1e-2)


def test_a_world_that_does_not_divide_the_model_is_refused(golden_dir):
    config = DeepseekV41.from_checkpoint(golden_dir).config
    with pytest.raises(ValueError, match="do not divide"):
        check_divisible(config, 3)


def test_rank_bytes_are_what_a_loaded_rank_holds(golden_dir):
    """The plan the load is checked against (rank_bytes) counts what from_checkpoint keeps:
    each rank's experts and heads, a copy of the rest, to the byte."""
    ckpt = Checkpoint(golden_dir)
    for world in (1, 2):
        for tier in ("prefill", "decode"):
            model = DeepseekV41.from_checkpoint(golden_dir, tier=tier, parallel=Parallel(world - 1, world))
            plan = rank_bytes(ckpt.config, world, tier, ckpt.spec_bytes)
            assert (plan.device, plan.host) == (model.ops.weights.nbytes, 0), (world, tier)  # its Engram is small
    assert rank_bytes(ckpt.config, 1, "decode").device == rank_bytes(ckpt.config, 1, "decode", ckpt.spec_bytes).device


GiB = 2**30


def _release_config() -> ModelConfig:
    """The release's config.json (spec/model-v41.md §1.1): the bench preset's widths and depth
    with all 384 + 128 routed experts and the full Engram tables."""
    raw = preset_config("bench")
    raw["text_config"].update(n_routed_experts=384, dspark_n_routed_experts=128, engram_vocab_size=16_000_000,
                              engram_num_embeddings=[384_006_168, 384_016_682])
    return ModelConfig.from_dict(raw)


def test_the_release_checkpoint_fits_four_h200s_or_eight_80gb_gpus():
    config = _release_config()
    specs = model_tensors(config)
    block = config.quant.weight_block
    # the tensor table against the spec's byte budget: 475.24 GiB with 0.90 of vision tensors
    # (which text serving skips), the routed experts 275.67 GiB of it
    assert round(sum(s.nbytes(block) for s in specs) / GiB, 2) == 474.34
    assert round(sum(s.nbytes(block) for s in specs if ".ffn.experts." in s.name) / GiB, 2) == 275.67
    decode = {world: rank_bytes(config, world, "decode") for world in (2, 4, 8)}
    assert all(plan.host > 180 * GiB for plan in decode.values())  # the Engram tables stay in host memory
    assert decode[8].device < 41 * GiB  # 8 x 80 GB (H100): ~39 GiB a GPU left for the pool and activations
    assert 75 * GiB < decode[4].device < 76 * GiB  # 4 x H200 (141 GB): not 4 x 80 GB
    assert decode[2].device > 141e9  # 2 x H200: no
    assert rank_bytes(config, 8, "prefill").device < decode[8].device  # no DSpark stages


def test_a_gpu_too_small_for_a_ranks_weights_is_refused_before_loading(monkeypatch):
    config = _release_config()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (70 * GiB, 79 * GiB))
    with pytest.raises(ValueError, match=r"each of 4 rank\(s\) holds 75\.2 GiB .* over 8 GPUs a rank would hold 40\.2"):
        check_fits(config, 4, "decode", torch.device("cuda", 0))
    check_fits(config, 8, "decode", torch.device("cuda", 0))
    check_fits(config, 1, "decode", torch.device("cpu"))  # host memory is not checked


def test_fp4_moe_computes_only_this_ranks_experts():
    """Pairs routed to other ranks' experts (id == local count) contribute nothing."""
    g = torch.Generator().manual_seed(5)
    E, H, inter, T, k = 4, 64, 64, 9, 2
    w13 = [quantize_fp4_weight(torch.randn(2 * inter, H, generator=g) / 6) for _ in range(E)]
    w2 = [quantize_fp4_weight(torch.randn(H, inter, generator=g) / 6) for _ in range(E)]
    stack = [torch.stack([w[i] for w in ws]) for ws in (w13, w2) for i in (0, 1)]
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(2 * E, generator=g)[:k] for _ in range(T)])  # 8 experts, 4 ours
    weights = torch.rand(T, k, generator=g)
    ours = idx < E
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    experts = quad_experts(*[t.to(dev) for t in stack])
    got = fp4_moe(x.to(dev), torch.where(ours, idx, E).to(dev), weights.to(dev), *experts, 0.7).cpu()
    ref = fp4_moe_ref(x, idx.clamp_max(E - 1), weights * ours, *stack, 0.7)
    assert (got - ref).abs().max() < (1e-4 if dev == "cpu" else 5e-3) * ref.abs().max() + 1e-6


def test_single_rank_parallel_is_a_no_op():
    p = Parallel()
    t = torch.ones(3)
    assert p.all_reduce(t) is t and p.split(8) == range(0, 8) and p.rows(5) == slice(0, 5, 1)
