"""The DSpark drafter is wired right.

Construction (`write_copying_checkpoint`): every sublayer of target and drafter outputs zero,
so the target is a bigram model (logits = head @ embed[t], exactly), the noise token's
embedding is zero and the Markov head copies the bigram. Block row 0 (token y) then yields
the target's logits for y, every later row only the Markov term of the previous draft, and
the five drafts must be exactly the target's next five greedy tokens: this checks that the
block starts with y at p+1, that each draft feeds the next row's Markov term in order, and
the final collapse, norm and head. A second test checks that the stage rings matter and that
drafts depend only on the committed context (one-shot vs token-by-token ring filling).
"""

import pytest
import torch

from dsflash.kvcache.state import DenseCache
from dsflash.model.checkpoint_writer import write_copying_checkpoint
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.dspark import DSparkDrafter
from dsflash.model.runner import greedy, step


@pytest.fixture(scope="module")
def copying_checkpoint(tmp_path_factory):
    return write_copying_checkpoint(tmp_path_factory.mktemp("copy"), seed=3)


def test_drafts_equal_target_greedy_when_the_drafter_copies_it(copying_checkpoint):
    model = DeepseekV41.from_checkpoint(copying_checkpoint)
    drafter = DSparkDrafter(model)
    prompt = torch.tensor([0, 4021, 17, 99, 12345, 7, 800, 65000, 3, 42])
    with torch.inference_mode():
        expected = greedy(model, prompt, 6)
        cache = DenseCache(model.config)
        result = step(model, [cache], [prompt], taps=True)
        drafter.absorb(cache, 0, result.taps[0])
        y = int(result.logits[0][-1].argmax())
        proposal = drafter.propose([(cache, y)])
    assert y == expected[0]
    assert proposal.drafts[0].tolist() == expected[1:6]
    assert proposal.logits.shape == (1, 5, model.config.vocab_size)
    assert ((proposal.confidence > 0) & (proposal.confidence < 1)).all()


def test_drafts_depend_on_the_committed_context_only(tiny_model):
    drafter = DSparkDrafter(tiny_model)
    prompt = torch.tensor([0, 11, 222, 3333, 44444, 5, 66, 777, 8888, 99, 1000, 12, 13, 14])
    with torch.inference_mode():
        one = DenseCache(tiny_model.config)
        r = step(tiny_model, [one], [prompt], taps=True)
        drafter.absorb(one, 0, r.taps[0])
        many = DenseCache(tiny_model.config)
        for i, token in enumerate(prompt.tolist()):
            drafter.absorb(many, i, step(tiny_model, [many], [torch.tensor([token])], taps=True).taps[0])
        y = int(r.logits[0][-1].argmax())
        a = drafter.propose([(one, y)])
        on_host = drafter.propose([(one, y)], lambda _i, logits: logits.float().argmax(-1).tolist())
        b = drafter.propose([(many, y)])
        empty = DenseCache(tiny_model.config)
        step(tiny_model, [empty], [prompt])  # no rings absorbed: the block sees no context
        c = drafter.propose([(empty, y)])
    assert torch.equal(a.drafts, on_host.drafts) and torch.equal(a.logits, on_host.logits)  # host ints or a tensor
    assert (a.logits - b.logits).abs().max() < 0.05
    assert (a.logits - c.logits).abs().max() > 1e-3  # the stage rings do matter


def test_absorbing_a_batch_equals_absorbing_each_alone(tiny_model):
    """A decode step absorbs its whole batch at once: each cache must get the rings it would
    alone, also when it keeps only the last rows (a prompt longer than the ring)."""
    drafter = DSparkDrafter(tiny_model)
    prompts = [torch.tensor([0, 5, 77, 900, 12]), torch.arange(3, 3 + 3 * tiny_model.config.sliding_window),
               torch.tensor([0, 4000])]
    alone, together, ys, taps = [], [], [], []
    with torch.inference_mode():
        for prompt in prompts:
            for caches in (alone, together):
                caches.append(DenseCache(tiny_model.config))
                result = step(tiny_model, [caches[-1]], [prompt], taps=True)
            taps.append(result.taps[0])
            ys.append(int(result.logits[0][-1].argmax()))
        assert prompts[1].numel() > alone[1].ring_capacity
        for cache, t in zip(alone, taps):
            drafter.absorb(cache, 0, t)
        drafter.absorb_many([(cache, 0, t) for cache, t in zip(together, taps)])
        for a, b, y in zip(alone, together, ys):
            assert torch.equal(drafter.propose([(a, y)]).logits, drafter.propose([(b, y)]).logits)
