"""The model against the independent reference logits: every row of golden/README.md's tolerance
table, for every golden prompt (shares pooled over the prompts, as the README defines them)."""

import pytest
import torch

from dsflash.kvcache.state import DenseCache
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.runner import greedy, prompt_logits, step


def _distances(model, golden, mode, key="logits"):
    rows = []
    for prompt in golden:
        with torch.inference_mode():
            got = prompt_logits(model, prompt["input_ids"], mode)
        ref = prompt[key]
        rows.append(((got - ref).abs().amax(-1), got.argmax(-1) == ref.argmax(-1)))
    d = torch.cat([r[0] for r in rows])
    same = torch.cat([r[1] for r in rows])
    return d, same


def test_noqat_logits_match_everywhere(golden_dir, golden):
    model = DeepseekV41.from_checkpoint(golden_dir, qat=False)
    d, same = _distances(model, golden, "full", "logits_noqat")
    assert d.max() <= 1e-3, f"max {d.max():.3g}"
    assert same.all()


@pytest.mark.parametrize("mode", ["full", "chunked:1", "chunked:3", "chunked:16", "chunked:128"])
def test_qat_logits_within_tolerance(golden_model, golden, mode):
    d, same = _distances(golden_model, golden, mode)
    share = lambda bound: (d <= bound).float().mean().item()  # noqa: E731
    assert share(1e-2) >= 0.75, share(1e-2)
    assert share(0.1) >= 0.90, share(0.1)
    assert d.max() <= 8, d.max()
    assert same.float().mean() >= 0.97


def test_greedy_ids_identical(golden_model, golden):
    for prompt in golden:
        with torch.inference_mode():
            out = greedy(golden_model, prompt["input_ids"], len(prompt["greedy_ids"]))
        assert out == prompt["greedy_ids"].tolist()


def test_incremental_step_logits_teacher_forced(golden_model, golden):
    ds, same = [], []
    for prompt in golden:
        cache = DenseCache(golden_model.config)
        with torch.inference_mode():
            rows = [step(golden_model, [cache], [prompt["input_ids"]]).logits[0][-1]]
            for token in prompt["greedy_ids"][:-1].tolist():
                rows.append(step(golden_model, [cache], [torch.tensor([token])]).logits[0][-1])
        rows = torch.stack(rows)
        ref = prompt["greedy_step_logits"]
        ds.append((rows - ref).abs().amax(-1))
        same.append(rows.argmax(-1) == ref.argmax(-1))
    d = torch.cat(ds)
    assert (d <= 0.1).float().mean() >= 0.85 and d.max() <= 8
    assert torch.cat(same).all()
