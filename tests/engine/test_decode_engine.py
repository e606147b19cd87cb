"""Continuous batching with speculative blocks: exactness, batching, memory bounds."""

import pytest
import torch

from dsflash.decode_worker.engine import DecodeEngine, DecodeEngineConfig, DecodeError
from dsflash.decode_worker.request import DecodeRequest, FinishReason
from dsflash.decode_worker.sampling import SamplingParams
from dsflash.model.dspark import greedy_chooser
from dsflash.prefill_worker.engine import PrefillRequest

from .conftest import ScriptedDrafter, engine_with, greedy_request, make_pool, run_to_end


def test_speculative_greedy_equals_plain_greedy_on_golden_prompts(golden_model, golden):
    pool = make_pool(golden_model)
    for spec in (0, 5):
        engine = engine_with(golden_model, pool, spec)
        reqs = [greedy_request(f"g{i}", p["input_ids"].tolist()) for i, p in enumerate(golden)]
        done = run_to_end(engine, reqs)
        for i, p in enumerate(golden):
            assert done[f"g{i}"].output == p["greedy_ids"].tolist(), (spec, i)
    assert pool.is_empty()


def test_partial_acceptance_and_rollback_stay_exact(golden_model, golden):
    """Drafts right and wrong at every position: outputs still equal plain greedy."""
    pool = make_pool(golden_model)
    engine = engine_with(golden_model, pool, 5)
    truth = {f"s{i}": p["input_ids"].tolist() + p["greedy_ids"].tolist() for i, p in enumerate(golden)}
    engine.drafter = ScriptedDrafter(engine, truth, 5)
    reqs = [greedy_request(f"s{i}", p["input_ids"].tolist()) for i, p in enumerate(golden)]
    done = run_to_end(engine, reqs)
    lengths = set()
    for i, p in enumerate(golden):
        assert done[f"s{i}"].output == p["greedy_ids"].tolist()
        lengths |= set(done[f"s{i}"].stats.accepted)
    assert len(lengths) >= 4  # several acceptance lengths happened
    assert max(lengths) > 1
    assert pool.is_empty()


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 120000, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_batch_of_eight_joining_and_leaving_equals_alone(tiny_model, oracle):
    prompts = _prompts(8, seed=1)
    max_tokens = [3, 9, 14, 5, 12, 7, 16, 10]
    pool = make_pool(tiny_model)
    engine = engine_with(tiny_model, pool, 5)
    truth = {f"b{i}": p + oracle(tiny_model, p, m) for i, (p, m) in enumerate(zip(prompts, max_tokens))}
    engine.drafter = ScriptedDrafter(engine, truth, 5)
    reqs = [greedy_request(f"b{i}", p, m) for i, (p, m) in enumerate(zip(prompts, max_tokens))]
    done = run_to_end(engine, reqs, add_at=[0, 0, 1, 2, 4, 5, 7, 9])
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        assert done[f"b{i}"].output == oracle(tiny_model, p, m), i
        assert done[f"b{i}"].finish_reason is FinishReason.LENGTH
    assert pool.is_empty()


def test_real_drafter_batch_equals_alone(tiny_model, oracle):
    prompts = _prompts(4, seed=2)
    pool = make_pool(tiny_model)
    engine = engine_with(tiny_model, pool, 5)
    choosers = []
    propose = engine.drafter.propose
    engine.drafter.propose = lambda requests, choose: choosers.append(choose) or propose(requests, choose)
    done = run_to_end(engine, [greedy_request(f"d{i}", p, 6) for i, p in enumerate(prompts)], add_at=[0, 1, 1, 3])
    for i, p in enumerate(prompts):
        assert done[f"d{i}"].output == oracle(tiny_model, p, 6)
        assert len(done[f"d{i}"].stats.step_ms) == len(done[f"d{i}"].stats.accepted)
    assert pool.is_empty()
    # an all-greedy batch drafts on the device: the host waits once a block, not once a row
    assert choosers and all(choose is greedy_chooser for choose in choosers)


def test_sampled_outputs_reproducible_with_seed(tiny_model):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, top_k=50, seed=1234,
                            repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.1, logprobs=True,
                            top_logprobs=3)
    prompt = _prompts(1, seed=3)[0]
    outs = []
    for companions in (0, 3):  # alone, then in a batch with others
        pool = make_pool(tiny_model)
        reqs = [DecodeRequest("seeded", prompt, params)]
        reqs += [DecodeRequest(f"o{i}", p, SamplingParams(max_tokens=8, temperature=1.0, seed=i))
                 for i, p in enumerate(_prompts(companions, seed=4))]
        done = run_to_end(engine_with(tiny_model, pool, 5), reqs)
        outs.append(done["seeded"])
        assert pool.is_empty()
    assert outs[0].output == outs[1].output and len(outs[0].output) == 12
    lp = outs[0].logprobs
    assert len(lp) == 12 and all(x.logprob <= 0 and len(x.top) == 3 for x in lp)


def test_stop_token_ids_eos_and_max_tokens(tiny_model, oracle):
    prompt = _prompts(1, seed=5)[0]
    ref = oracle(tiny_model, prompt, 10)
    stop_at = ref[4]
    first = ref.index(stop_at)
    pool = make_pool(tiny_model)
    done = run_to_end(engine_with(tiny_model, pool, 5), [greedy_request("st", prompt, 10, stop_token_ids=(stop_at,))])
    assert done["st"].output == ref[: first + 1] and done["st"].finish_reason is FinishReason.STOP
    assert pool.is_empty()


def test_min_tokens_holds_off_a_stop_id_and_speculation_stays_exact(tiny_model, oracle):
    """The greedy output's fifth token as a stop id, held off for the first 7 tokens: the output
    leaves plain greedy where that token was masked, runs to at least 7 tokens, and is the same
    with speculative blocks as without."""
    prompt = _prompts(1, seed=5)[0]
    ref = oracle(tiny_model, prompt, 10)
    stop_at = ref[4]
    first = ref.index(stop_at)
    runs = _with_and_without_speculation(
        tiny_model, lambda: [greedy_request("mt", prompt, 12, stop_token_ids=(stop_at,), min_tokens=7)])
    for done in runs:
        out = done["mt"]
        assert out.output[:first] == ref[:first] and out.output[first] != stop_at
        assert len(out.output) >= 7 and stop_at not in out.output[:7]
        assert out.finish_reason is (FinishReason.STOP if out.output[-1] == stop_at else FinishReason.LENGTH)
    assert runs[0]["mt"].output == runs[1]["mt"].output


def _with_and_without_speculation(model, make_requests) -> list[dict]:
    """Fresh requests run on an engine without speculative blocks, then with them ({id: request}
    each); every cache released after."""
    runs = []
    for spec in (0, 5):
        pool = make_pool(model)
        runs.append(run_to_end(engine_with(model, pool, spec), make_requests()))
        assert pool.is_empty()
    return runs


def test_logit_bias_bans_and_forces_tokens_and_speculation_stays_exact(tiny_model, oracle):
    """logit_bias: -100 on the greedy output's third token keeps it out of the output, which
    leaves plain greedy there, the same with speculative blocks as without (the drafter's
    choices and the verification both see the bias); +100 on one token makes every token it."""
    prompt = _prompts(1, seed=7)[0]
    ref = oracle(tiny_model, prompt, 10)
    banned = ref[2]
    first = ref.index(banned)
    runs = _with_and_without_speculation(tiny_model, lambda: [
        greedy_request("ban", prompt, 10, logit_bias=((banned, -100.0),)),
        greedy_request("force", prompt, 6, logit_bias=((4321, 100.0),))])
    for done in runs:
        out = done["ban"].output
        assert out[:first] == ref[:first] and banned not in out and len(out) == 10
        assert done["force"].output == [4321] * 6
    assert runs[0]["ban"].output == runs[1]["ban"].output


def test_a_stop_string_held_off_by_min_tokens_counts_again_after():
    """The worker's stop strings wait out min_tokens, and one seen in those tokens' text does
    not hide the same string ending later."""
    from dsflash.decode_worker.stops import StopStringMatcher, finish_reason

    words = {1: "a", 2: ",", 3: " b", 4: ",", 5: " c"}
    params = SamplingParams(max_tokens=9, stop=(",",), min_tokens=2)
    matcher = StopStringMatcher(lambda ids: "".join(words[t] for t in ids), params.stop)
    reasons = [finish_reason(params, 0, n, t, matcher) for n, t in enumerate([1, 2, 3, 4, 5], start=1)]
    assert reasons == [None, None, None, FinishReason.STOP, None]


def test_stop_strings_across_token_boundaries(tiny_model, oracle):
    prompt = _prompts(1, seed=6)[0]
    ref = oracle(tiny_model, prompt, 10)

    def text(ids):
        return "".join(f"<{t}>" for t in ids)  # stands in for a tokenizer

    stop = text(ref[5:7])[3:-2]  # spans two tokens, starts and ends inside them
    engine = engine_with(tiny_model, make_pool(tiny_model), 5)
    engine.decode_text = text
    done = run_to_end(engine, [greedy_request("ss", prompt, 10, stop=(stop,))])
    assert done["ss"].output == ref[:7] and done["ss"].finish_reason is FinishReason.STOP


def test_full_pool_preempts_and_still_exact(tiny_model, oracle):
    """Four short prompts are admitted together; their growth overflows the pool, so younger
    requests are preempted and rebuilt, and every output is still what it is alone."""
    prompts = [p[:3 + i] for i, p in enumerate(_prompts(4, seed=7))]
    layout_pool = make_pool(tiny_model, pages=30, slots=4, page_entries=8)
    engine = engine_with(tiny_model, layout_pool, 5)
    reqs = [greedy_request(f"p{i}", p, 40) for i, p in enumerate(prompts)]
    done = run_to_end(engine, reqs, max_steps=2000)
    for i, p in enumerate(prompts):
        assert done[f"p{i}"].output == oracle(tiny_model, p, 40)
    assert sum(r.stats.preemptions for r in done.values()) > 0
    assert layout_pool.is_empty()


def test_request_that_can_never_fit_is_refused(tiny_model):
    pool = make_pool(tiny_model, pages=4, slots=2, page_entries=8)
    engine = engine_with(tiny_model, pool, 5)
    with pytest.raises(DecodeError, match="can never fit"):
        engine.add(greedy_request("huge", list(range(3, 200)), 16))
    with pytest.raises(DecodeError, match="token ids"):
        engine.add(greedy_request("bad", [1, 2, 10**9], 4))


def test_abort_releases_memory(tiny_model):
    pool = make_pool(tiny_model)
    engine = engine_with(tiny_model, pool, 5)
    engine.add(greedy_request("a", _prompts(1, seed=8)[0], 50))
    engine.step()
    engine.step()
    event = engine.abort("a")
    assert event.finish_reason is FinishReason.ABORT
    assert not engine.has_work() and pool.is_empty()


def _prefilled(model, pool, tokens):
    """A cache holding `tokens` and its prefill output, as a prefill worker hands them over."""
    from dsflash.prefill_worker.engine import PrefillEngine, PrefillRequest

    prefill = PrefillEngine(model, pool)
    job = prefill.add(PrefillRequest("handoff", list(tokens)))
    while not prefill.step():
        pass
    return job.cache, job.output


def test_prompt_split_before_its_last_token_keeps_that_cache(tiny_model, oracle):
    """history_drops_reply: the cache arrives one token short, a copy of it is kept for the
    conversation, the engine computes the last token. Output and the kept cache are exact."""
    prompt = _prompts(1, seed=5)[0] + [11, 12]
    pool = make_pool(tiny_model)
    engine = engine_with(tiny_model, pool, 5)
    kept = {}

    def take(request):
        kept["cache"], request.snapshot = request.snapshot, None
        return False  # the live cache goes back to the pool

    engine.on_finish = take
    cache, output = _prefilled(tiny_model, pool, prompt[:-1])
    first = greedy_request("split", prompt, 6)
    first.cache, first.prefill, first.keep_before_last, first.conversation_id = cache, output, True, "c"
    assert run_to_end(engine, [first])["split"].output == oracle(tiny_model, prompt, 6)
    snapshot = kept["cache"]
    assert snapshot.num_tokens == len(prompt) - 1
    # the next turn extends the prompt minus its last token: continued from the kept cache,
    # the engine computes only the new tokens and decodes as if from scratch
    extended = prompt[:-1] + [21, 22, 23]
    second = greedy_request("next", extended, 6)
    second.cache = snapshot
    engine.on_finish = None
    assert run_to_end(engine, [second])["next"].output == oracle(tiny_model, extended, 6)
    assert pool.is_empty()


def test_aborted_split_request_returns_its_kept_copy(tiny_model):
    prompt = _prompts(1, seed=6)[0] + [11, 12]
    pool = make_pool(tiny_model)
    engine = engine_with(tiny_model, pool, 0)
    cache, output = _prefilled(tiny_model, pool, prompt[:-1])
    request = greedy_request("gone", prompt, 50)
    request.cache, request.prefill, request.keep_before_last, request.conversation_id = cache, output, True, "c"
    engine.add(request)
    assert request.snapshot is not None
    engine.step()
    engine.abort("gone")
    assert request.snapshot is None and pool.is_empty()


def test_kept_caches_give_way_to_a_request_that_must_be_computed(tiny_model, oracle):
    """Every slot held by kept conversation caches: a request the engine must compute itself
    evicts them (the least recent first) instead of waiting for a slot forever."""
    from dsflash.kvcache.paged import PagedCache

    pool = make_pool(tiny_model, slots=3)
    kept = [PagedCache(pool, tiny_model.config) for _ in range(3)]

    def reclaim(_nbytes):
        if not kept:
            return 0
        cache = kept.pop(0)
        cache.release()
        return cache.pool_bytes

    engine = DecodeEngine(tiny_model, pool, DecodeEngineConfig(spec_tokens=5), reclaim=reclaim)
    prompt = _prompts(1, seed=9)[0]
    done = run_to_end(engine, [greedy_request("computed", prompt, 6)], max_steps=50)
    assert done["computed"].output == oracle(tiny_model, prompt, 6) and len(kept) == 2
    for cache in kept:
        cache.release()
    assert pool.is_empty()


def test_a_cache_that_arrived_short_is_finished_with_no_slot_free(tiny_model, oracle):
    """Its cache holds its slot already: the engine computes its last token though every other
    slot is taken (and nothing can be evicted), keeping no copy where there is no room for one."""
    from dsflash.kvcache.paged import PagedCache

    prompt = _prompts(1, seed=6)[0] + [11, 12]
    pool = make_pool(tiny_model, slots=2)
    cache, output = _prefilled(tiny_model, pool, prompt[:-1])
    other = PagedCache(pool, tiny_model.config)
    request = greedy_request("short", prompt, 6)
    request.cache, request.prefill, request.keep_before_last, request.conversation_id = cache, output, True, "c"
    done = run_to_end(engine_with(tiny_model, pool, 5), [request], max_steps=50)
    assert done["short"].output == oracle(tiny_model, prompt, 6) and done["short"].snapshot is None
    other.release()
    assert pool.is_empty()


def test_a_scored_prompt_is_rebuilt_whole_and_its_first_event_carries_the_scores(golden_model, golden):
    """prompt_logprobs on a request the engine computes itself: the prompt is built whole (the
    partial cache it arrived with is dropped: its rows have no logits), the first event brings
    each token's score after the first, later events none, and the output is still plain greedy."""
    p = golden[2]
    ids = p["input_ids"].tolist()
    pool = make_pool(golden_model)
    engine = engine_with(golden_model, pool, 5)
    engine.rebuilder.add(PrefillRequest("head", ids[:20]))
    while engine.rebuilder.has_work():
        (head,) = engine.rebuilder.step() or (None,)
    request = greedy_request("scored", ids, prompt_logprobs=2)
    request.cache = head.cache  # arrived holding the first 20 tokens
    engine.add(request)
    events = []
    while engine.has_work():
        events += engine.step()
    assert pool.is_empty()  # the partial cache was released, the whole one too
    assert request.output == p["greedy_ids"].tolist()
    first, later = events[0], events[1:]
    assert [lp.token for lp in first.prompt_logprobs] == ids[1:]
    assert later and all(e.prompt_logprobs is None for e in later)
    logp = torch.log_softmax(p["logits"].float(), -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert (torch.tensor([lp.logprob for lp in first.prompt_logprobs]) - logp).abs().max() < 0.1
    assert all(len(lp.top) == 2 for lp in first.prompt_logprobs)
