"""Sampling knobs and speculative rejection sampling."""

import pytest
import torch

from dsflash.decode_worker.sampling import RequestSampler, SamplingError, SamplingParams
from dsflash.decode_worker.spec import accept_block, accept_greedy, greedy_targets
from dsflash.model.logprobs import token_logprobs

V = 8


def _sampler(seed, **kw):
    return RequestSampler(SamplingParams(seed=seed, **kw), prompt_tokens=[], vocab_size=V)


def test_filters_by_hand():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0])
    x = _sampler(0, top_k=3).processed(logits)
    assert torch.isinf(x[3:]).all() and torch.isfinite(x[:3]).all()
    p = torch.softmax(logits, -1)
    x = _sampler(0, top_p=float(p[0] + p[1] * 0.5)).processed(logits)
    assert torch.isfinite(x[:2]).all() and torch.isinf(x[2:]).all()
    x = _sampler(0, min_p=float(p[2] / p[0]) * 0.99).processed(logits)
    assert torch.isfinite(x[:3]).all() and torch.isinf(x[3:]).all()


def test_penalties_by_hand():
    s = RequestSampler(SamplingParams(seed=0, temperature=1.0, repetition_penalty=2.0, presence_penalty=0.5,
                                      frequency_penalty=0.25), prompt_tokens=[0], vocab_size=V)
    s.record([1, 1, 2])
    logits = torch.tensor([2.0, 2.0, -2.0, 1.0, 0, 0, 0, 0])
    x = s.processed(logits, extra=[3])
    assert x[0] == 1.0  # prompt token, positive: divided
    assert x[1] == 1.0 - 0.5 - 0.5  # 2/2 - presence - 2 * frequency
    assert x[2] == -4.0 - 0.5 - 0.25  # negative: multiplied
    assert x[3] == 0.5 - 0.5 - 0.25  # counted through `extra`


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=2),
                                 dict(max_tokens=0), dict(top_logprobs=21), dict(presence_penalty=3),
                                 dict(temperature=float("nan")), dict(min_tokens=-1),
                                 dict(max_tokens=4, min_tokens=5)])
def test_invalid_params_are_rejected(bad):
    with pytest.raises(SamplingError):
        SamplingParams(**bad)


@pytest.mark.parametrize("greedy", [True, False])
def test_min_tokens_holds_off_eos_and_stop_ids(greedy):
    """EOS (7) and the stop ids are masked until min_tokens are out, counting the recorded
    tokens and the uncommitted `extra`; other tokens never are."""
    params = SamplingParams(seed=0, temperature=0.0 if greedy else 1.0, min_tokens=3, max_tokens=8,
                            stop_token_ids=(2,))
    s = RequestSampler(params, prompt_tokens=[], vocab_size=V, eos_token_id=7)
    logits = torch.tensor([0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0, 8.0])  # the stop id first, then EOS
    held = [2, 7]
    assert torch.isinf(s.processed(logits)[held]).all() and torch.isfinite(s.processed(logits)[[0, 1, 3]]).all()
    assert s.choose(logits)[0] not in held and not s.plain_greedy
    s.record([0])
    assert torch.isinf(s.processed(logits, extra=[1])[held]).all()  # output token 3 of 3: still held
    assert torch.isfinite(s.processed(logits, extra=[1, 1])[held]).all()  # the fourth may end it
    s.record([1, 1])
    assert torch.isfinite(s.processed(logits)[held]).all() and s.plain_greedy == greedy
    ignoring = RequestSampler(SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True, stop_token_ids=(2,)),
                              [], V, eos_token_id=7)
    assert ignoring.choose(logits)[0] == 7  # EOS would not end this request: only its stop ids are held


def _chi2(counts, probs):
    expected = probs * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def test_speculative_sampling_follows_the_target_distribution():
    """Chi-squared on a vocabulary slice of 8: the first emitted token of a speculative block
    follows the target's distribution (drafts from a badly-off drafter), like plain sampling."""
    g = torch.Generator().manual_seed(0)
    k = 2
    target = torch.randn(k + 1, V, generator=g) * 1.5
    draft = torch.randn(k, V, generator=g) * 1.5
    trials = 20000
    first = torch.zeros(V)
    plain = torch.zeros(V)
    for t in range(trials):
        s = _sampler(t, temperature=1.0)
        d0, q0 = s.choose(draft[0])
        d1, q1 = s.choose(draft[1], [d0])
        emitted = accept_block(s, target, [d0, d1], [q0, q1])
        first[emitted[0]] += 1
        plain[_sampler(10**6 + t, temperature=1.0).choose(target[0])[0]] += 1
    p0 = torch.softmax(target[0], -1)
    # df = 7; the 0.001 critical value is 24.3
    assert _chi2(first, p0) < 24.3, _chi2(first, p0)
    assert _chi2(plain, p0) < 24.3
    # the speculative and the plain samples agree with each other too (two-sample chi-squared)
    pooled = (first + plain) / (2 * trials)
    assert _chi2(first, pooled) + _chi2(plain, pooled) < 24.3


def test_greedy_acceptance_stops_at_first_mismatch():
    s = _sampler(0, temperature=0.0)
    target = torch.full((4, V), -5.0)
    for row, tok in enumerate([3, 5, 1, 7]):
        target[row, tok] = 5.0
    assert accept_block(s, target, [3, 5, 1], None) == [3, 5, 1, 7]
    assert accept_block(s, target, [3, 4, 1], None) == [3, 5]
    assert accept_block(s, target, [2, 5, 1], None) == [3]


def test_batched_greedy_choice_equals_each_request_alone():
    """One argmax over a batch's rows (greedy_targets) and accept_greedy give what accept_block
    gives request by request; requests whose penalties change the logits keep that path."""
    g = torch.Generator().manual_seed(4)
    samplers = [_sampler(0, temperature=0.0), _sampler(1, top_k=1), _sampler(2, temperature=0.0, repetition_penalty=1.3),
                _sampler(3, temperature=0.7), _sampler(4, temperature=0.0)]
    logits = [torch.randn(4, V, generator=g) for _ in samplers]
    logits[4][1] = logits[4][1].max() + 1  # a tie-free row, then one with two equal maxima
    logits[4][2, [2, 6]] = logits[4][2].max() + 1
    targets = greedy_targets(samplers, logits)
    assert sorted(targets) == [0, 1, 4]
    for j in targets:
        for drafts in ([0, 0, 0], [int(t) for t in logits[j].argmax(-1)[:3]], [int(logits[j][0].argmax()), 7, 7]):
            assert accept_greedy(targets[j], drafts) == accept_block(samplers[j], logits[j], drafts, None)


def test_the_workers_params_come_whole_from_the_proto():
    from dsflash.decode_worker.service import sampling_from_proto
    from dsflash.v1 import worker_pb2

    msg = worker_pb2.SamplingParams(max_tokens=9, temperature=0.5, top_k=4, stop_token_ids=[3], ignore_eos=True,
                                    min_tokens=2, seed=7, logprobs=True, top_logprobs=2)
    assert sampling_from_proto(msg) == SamplingParams(max_tokens=9, temperature=0.5, top_k=4, stop_token_ids=(3,),
                                                      ignore_eos=True, min_tokens=2, seed=7, logprobs=True,
                                                      top_logprobs=2)


def test_token_logprobs_rows_alternatives_and_ranks():
    """token_logprobs against log_softmax row by row: the chosen token's logprob, the top
    alternatives most likely first, and its 1-based rank where asked (0 where not)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 50, generator=g)
    tokens = [7, 0, 49, 21, 3]
    logp = torch.log_softmax(logits, -1)
    ranked = token_logprobs(logits, tokens, 3, rank=True)
    for row, token, got in zip(logp, tokens, ranked):
        assert got.token == token and abs(got.logprob - float(row[token])) < 1e-6
        assert got.rank == int((row > row[token]).sum()) + 1
        best = torch.topk(row, 3)
        assert [t for t, _ in got.top] == best.indices.tolist()
        assert all(abs(v - float(b)) < 1e-6 for (_, v), b in zip(got.top, best.values))
    plain = token_logprobs(logits, tokens, 0)
    assert [lp.rank for lp in plain] == [0] * 5 and all(lp.top == [] for lp in plain)
    assert [lp.logprob for lp in plain] == [lp.logprob for lp in ranked]
