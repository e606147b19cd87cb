"""CED prefill (encoder over every token, decoder over the tail): exact where it should be,
and its deviation from the exact path measured on the golden prompts."""

import torch

from dsflash.kvcache.state import DenseCache
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.runner import ced_tail_length, prefill_ced, step


def test_ced_is_exact_when_the_tail_covers_the_prompt(golden_dir, golden):
    model = DeepseekV41.from_checkpoint(golden_dir, qat=False)
    ids = golden[1]["input_ids"]
    with torch.inference_mode():
        exact = step(model, [DenseCache(model.config)], [ids]).logits[0][-1]
        ced = prefill_ced(model, DenseCache(model.config), ids, chunk=8, tail=len(ids)).logits
    assert (exact - ced).abs().max() < 1e-4


def test_ced_continuation_is_exact_on_a_warm_cache(golden_dir, golden):
    """A later turn: the decoder rings hold the earlier positions, so a replay over all new
    tokens loses nothing."""
    model = DeepseekV41.from_checkpoint(golden_dir, qat=False)
    ids = golden[2]["input_ids"]
    with torch.inference_mode():
        exact_cache, ced_cache = DenseCache(model.config), DenseCache(model.config)
        step(model, [exact_cache], [ids[:80]])
        step(model, [ced_cache], [ids[:80]])
        exact = step(model, [exact_cache], [ids[80:]]).logits[0][-1]
        ced = prefill_ced(model, ced_cache, ids[80:], chunk=7, tail=20).logits
    assert (exact - ced).abs().max() < 1e-4


def test_bounded_replay_deviation_on_golden_prompts(golden_model, golden):
    tail = ced_tail_length(golden_model)
    report = []
    for prompt in golden:
        ids = prompt["input_ids"]
        with torch.inference_mode():
            exact = step(golden_model, [DenseCache(golden_model.config)], [ids]).logits[0][-1]
            ced_cache = DenseCache(golden_model.config)
            ced = prefill_ced(golden_model, ced_cache, ids, chunk=64).logits
            # decoding continues from the CED cache with every layer
            out, logits = [], ced
            for _ in range(len(prompt["greedy_ids"])):
                out.append(int(logits.argmax()))
                logits = step(golden_model, [ced_cache], [torch.tensor([out[-1]])]).logits[0][-1]
        dev = (exact - ced).abs().max().item()
        report.append((len(ids), dev, out == prompt["greedy_ids"].tolist()))
        if len(ids) <= tail:
            assert dev == 0.0
        assert dev < 1.0  # bounded: the tail's early rows see a truncated decoder window
    print("\nCED bounded replay (tail %d): " % tail + ", ".join(f"T={t} max|dlogit|={d:.4f} greedy-same={g}"
                                                           for t, d, g in report))
    assert sum(g for *_, g in report) >= len(report) - 1
