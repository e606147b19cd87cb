"""Decode engine throughput on CPU: tokens/s, step time and DSpark acceptance length.

Two checkpoints: the random `tiny` one (a random drafter: acceptance ~1 token per step, so
this measures the engine's overhead per verified block) and the `copying` construction (the
drafter predicts its target exactly: 6 tokens per step, the most speculation can give).
The physical limit printed beside each figure is the plain one-token-per-step rate measured
in the same run: speculation pays where tokens/s exceeds it.

    python bench/engine_cpu.py [--batch 1 4 8] [--tokens 48]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from dsflash.decode_worker.engine import DecodeEngine, DecodeEngineConfig
from dsflash.decode_worker.request import DecodeRequest
from dsflash.decode_worker.sampling import SamplingParams
from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.pool import CachePool
from dsflash.model.checkpoint_writer import write_checkpoint, write_copying_checkpoint
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.prefill_worker.engine import PrefillEngine, PrefillRequest


def run(model: DeepseekV41, batch: int, tokens: int, spec: int, prompt_len: int = 64) -> dict:
    pool = CachePool(CacheLayout.for_model(model.config, page_entries=64), num_pages=4096, num_slots=batch + 1)
    prefill = PrefillEngine(model, pool)
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(3, 100000, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    for i, p in enumerate(prompts):
        prefill.add(PrefillRequest(f"r{i}", p))
    ready = {}
    while prefill.has_work():
        ready.update({r.request_id: r for r in prefill.step()})
    engine = DecodeEngine(model, pool, DecodeEngineConfig(max_running=batch, spec_tokens=spec))
    reqs = [DecodeRequest(f"r{i}", p, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
                          cache=ready[f"r{i}"].cache, prefill=ready[f"r{i}"].output) for i, p in enumerate(prompts)]
    for r in reqs:
        engine.add(r)
    engine.step()  # admission: first tokens from the prefill logits
    start = time.perf_counter()
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - start
    generated = sum(len(r.output) - 1 for r in reqs)
    accepted = [a for r in reqs for a in r.stats.accepted]
    return {"tok_s": generated / elapsed, "steps": steps, "step_ms": 1000 * elapsed / max(steps, 1),
            "accept": sum(accepted) / max(len(accepted), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny (random)": DeepseekV41.from_checkpoint(write_checkpoint(f"{tmp}/tiny", "tiny", seed=0)),
                  "copying": DeepseekV41.from_checkpoint(write_copying_checkpoint(f"{tmp}/copy", seed=0))}
        print(f"CPU threads: {torch.get_num_threads()}; greedy, {args.tokens} tokens per request, 64-token prompts")
        print(f"{'checkpoint':<14} {'batch':>5} {'plain tok/s':>12} {'spec tok/s':>11} {'ratio':>6} "
              f"{'accept len':>10} {'step ms':>8}")
        for name, model in models.items():
            for batch in args.batch:
                plain = run(model, batch, args.tokens, spec=0)
                spec = run(model, batch, args.tokens, spec=5)
                print(f"{name:<14} {batch:>5} {plain['tok_s']:>12.1f} {spec['tok_s']:>11.1f} "
                      f"{spec['tok_s'] / plain['tok_s']:>6.2f} {spec['accept']:>10.2f} {spec['step_ms']:>8.1f}")


if __name__ == "__main__":
    main()
