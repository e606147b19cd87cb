"""The prefill engine: chunking within a token budget, prefix reuse, CED, handoff to decode."""

import pytest
import torch

from dsflash.decode_worker.request import DecodeRequest
from dsflash.decode_worker.sampling import SamplingParams
from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.paged import PagedCache
from dsflash.kvcache.pool import CachePool, plain_allocator
from dsflash.kvcache.transport.checksum import SealedSums, checksum
from dsflash.model import prefill as prefill_module
from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.prefill_worker import engine as engine_module
from dsflash.prefill_worker.engine import PrefillEngine, PrefillEngineConfig, PrefillError, PrefillRequest
from dsflash.prefill_worker.scheduler import PrefillSchedulerConfig

from .conftest import engine_with, make_pool, run_to_end


def _drain(engine):
    done = {}
    steps = 0
    while engine.has_work():
        for r in engine.step():
            done[r.request_id] = r
        steps += 1
        assert steps < 1000
    return done, steps


def _config(budget, chunk, ced=False):
    return PrefillEngineConfig(PrefillSchedulerConfig(token_budget=budget, max_chunk=chunk), ced=ced)


def _engine_holding(model, prefix_ids, budget):
    """An engine (chunks of `budget`) on a fresh pool, and its finished request of `prefix_ids`."""
    pool = make_pool(model)
    engine = PrefillEngine(model, pool, _config(budget=budget, chunk=budget))
    engine.add(PrefillRequest("prefix", prefix_ids))
    return pool, engine, _drain(engine)[0]["prefix"]


def test_several_requests_per_step_within_budget(golden_model, golden):
    pool = make_pool(golden_model)
    engine = PrefillEngine(golden_model, pool, _config(budget=64, chunk=32))
    for i, p in enumerate(golden):
        engine.add(PrefillRequest(f"r{i}", p["input_ids"].tolist()))
    assert engine.queued_tokens == sum(len(p["input_ids"]) for p in golden)
    done, steps = _drain(engine)
    assert steps >= (5 + 37 + 100 + 300) // 64
    for i, p in enumerate(golden):
        out = done[f"r{i}"].output
        ref = p["logits"][-1]
        assert (out.logits - ref).abs().max() < 0.05 and int(out.logits.argmax()) == int(ref.argmax())
        assert done[f"r{i}"].cache.num_tokens == len(p["input_ids"])
        assert out.taps is not None and out.taps_start + out.taps.shape[0] == len(p["input_ids"])
        done[f"r{i}"].cache.release()
    assert pool.is_empty()


def test_prefix_reuse_computes_only_new_tokens(golden_model, golden):
    ids = golden[3]["input_ids"].tolist()
    pool, engine, prefix = _engine_holding(golden_model, ids[:200], budget=128)
    engine.add(PrefillRequest("rest", ids, cache=prefix.cache))
    done = _drain(engine)[0]["rest"]
    assert done.computed_tokens == 100
    engine.add(PrefillRequest("fresh", ids))
    fresh = _drain(engine)[0]["fresh"]
    assert (done.output.logits - fresh.output.logits).abs().max() < 0.05
    assert int(done.output.logits.argmax()) == int(golden[3]["logits"][-1].argmax())
    done.cache.release()
    fresh.cache.release()
    assert pool.is_empty()


def test_ced_option_close_to_exact(golden_model, golden):
    ids = golden[3]["input_ids"].tolist()
    pool = make_pool(golden_model)
    engine = PrefillEngine(golden_model, pool, _config(budget=96, chunk=96, ced=True))
    engine.add(PrefillRequest("ced", ids))
    out = _drain(engine)[0]["ced"]
    ref = golden[3]["logits"][-1]
    assert (out.output.logits - ref).abs().max() < 0.5 and int(out.output.logits.argmax()) == int(ref.argmax())
    out.cache.release()


def test_pages_are_sealed_as_chunks_fill_them(golden_model, golden):
    """Each step seals the pages its chunk filled, so a handoff sends sums it already has."""
    layout = CacheLayout.for_model(golden_model.config, page_entries=8)
    pool = CachePool(layout, 600, 4, sealed=SealedSums())
    engine = PrefillEngine(golden_model, pool, _config(budget=64, chunk=32))
    engine.add(PrefillRequest("r", golden[3]["input_ids"].tolist()))
    engine.step()
    after_one_chunk = len(pool.sealed)
    done, _ = _drain(engine)
    cache, pages = done["r"].cache, pool.pages_buffer.numpy()
    full = [p for s, t in cache.page_table.items() for p in t[:cache.counts[s] // layout.page_entries]]
    assert 0 < after_one_chunk < len(full) == len(pool.sealed)
    for page in full:
        span = (page * layout.page_bytes, layout.page_bytes)
        assert pool.sealed.lookup(pool.pages_segment, *span) == checksum(pages[span[0]:span[0] + span[1]])
    cache.release()
    assert len(pool.sealed) == 0


def test_never_fitting_and_invalid_prompts_are_refused(golden_model):
    engine = PrefillEngine(golden_model, make_pool(golden_model, pages=3, slots=2, page_entries=8))
    with pytest.raises(PrefillError, match="never fit"):
        engine.add(PrefillRequest("long", [5] * 500))
    with pytest.raises(PrefillError, match="out of range"):
        engine.add(PrefillRequest("bad", [5, 10**7]))
    with pytest.raises(PrefillError, match="empty"):
        engine.add(PrefillRequest("empty", []))


def test_handoff_through_serialization_decodes_identically(golden_model, golden):
    """Prefill in one pool, serialize, restore into another pool (another worker), decode:
    the same tokens as plain greedy."""
    prefill_pool, decode_pool = make_pool(golden_model), make_pool(golden_model)
    engine = PrefillEngine(golden_model, prefill_pool, _config(budget=256, chunk=256))
    for i, p in enumerate(golden):
        engine.add(PrefillRequest(f"h{i}", p["input_ids"].tolist()))
    done, _ = _drain(engine)
    decode = engine_with(golden_model, decode_pool, 5)
    requests = []
    for i, p in enumerate(golden):
        desc, payload = done[f"h{i}"].cache.serialize()
        done[f"h{i}"].cache.release()
        cache = PagedCache.deserialize(decode_pool, golden_model.config, desc, payload)
        requests.append(DecodeRequest(f"h{i}", p["input_ids"].tolist(), SamplingParams(max_tokens=16, temperature=0),
                                      cache=cache, prefill=done[f"h{i}"].output))
    finished = run_to_end(decode, requests)
    for i, p in enumerate(golden):
        assert finished[f"h{i}"].output == p["greedy_ids"].tolist()
    assert prefill_pool.is_empty() and decode_pool.is_empty()


def test_cache_restored_resumes_decoding_identically(tiny_model):
    pool = make_pool(tiny_model)
    prompt = list(range(100, 160))
    engine = PrefillEngine(tiny_model, pool)
    engine.add(PrefillRequest("a", prompt))
    first = _drain(engine)[0]["a"]
    desc, payload = first.cache.serialize()
    twin = PagedCache.deserialize(pool, tiny_model.config, desc, payload)
    decode = engine_with(tiny_model, pool, 5)
    params = SamplingParams(max_tokens=12, temperature=0.7, seed=99)
    a = DecodeRequest("a", prompt, params, cache=first.cache, prefill=first.output)
    b = DecodeRequest("b", prompt, params, cache=twin, prefill=first.output)
    done = run_to_end(decode, [a, b])
    assert done["a"].output == done["b"].output
    assert pool.is_empty()


def test_expert_block_warm_ups_meet_every_block_height_a_prompt_takes():
    """Each prompt shorter than the warm-up's chunk that runs its routed experts on fp4_moe
    meets a block height (and row layout) one of the warm-up's lengths met first: the bench
    preset's 128-row blocks from 2,048 tokens among them (a 3,000-token prompt compiled them)."""
    from dsflash.model.kernels import fp4_moe, prefill_gemms

    def key(tokens, k, experts):
        return {(parts, fp4_moe.block_height(tokens * k, experts, parts), tokens >= prefill_gemms.ROWS)
                for parts in {1, fp4_moe.SPLITS}}

    for k, experts, below in [(6, 48, 8191), (8, 256, 8191), (2, 8, 47), (6, 24, 700)]:
        lengths = engine_module.expert_block_warm_ups(k, experts, below)
        assert lengths == sorted(set(lengths)) and all(0 < n < below for n in lengths)
        met = set().union(*(key(n, k, experts) for n in lengths))
        cublas_from = -(-prefill_gemms.EXPERT_PAIRS * experts // k)
        assert all(key(t, k, experts) <= met for t in range(1, min(below, cublas_from)))
    assert 2048 in engine_module.expert_block_warm_ups(6, 48, 8191)


def test_warm_up_runs_a_whole_chunk_and_leaves_the_engine_as_it_found_it(golden_model, monkeypatch):
    """The prefill worker's start (GPU): synthetic prompts of the token budget and one token
    less (entry counts that 16 divides and does not: Triton specializes on it), chunked as a
    user's would be, then the short ones shorter than those (their own kernels and tiles);
    their caches are dropped and the engine is idle after. A pool too small for the budget
    takes the longest prompts it can hold (halving)."""
    pool = make_pool(golden_model)
    engine = PrefillEngine(golden_model, pool, _config(budget=48, chunk=32))
    prompts = []
    add = engine.add
    engine.add = lambda request: prompts.append(len(request.tokens)) or add(request)
    # (and expert_block_warm_ups' 4 and 32 of the tiny preset's 8 experts, 2 a row; BATCHED_WARM_UP: 201 > 48)
    assert engine.warm_up(48) == 48 and prompts == [48, 47, 1, 4, 5, 8, 12, 16, 32]
    assert not engine.has_work() and pool.is_empty()
    monkeypatch.setattr(engine_module, "SHORT_WARM_UPS", (20, 47, 300))
    monkeypatch.setattr(engine_module, "expert_block_warm_ups", lambda k, experts, below: [])
    monkeypatch.setattr(engine_module, "BATCHED_WARM_UP", (5, 6, 7))
    prompts.clear()
    held = []  # the requests each step holds: the batched ones go together
    step = engine.step
    engine.step = lambda: held.append(len(engine.requests)) or step()
    assert engine.warm_up(48) == 48 and prompts == [48, 47, 20, 5, 6, 7] and held[-1] == 3
    assert not engine.has_work() and pool.is_empty()
    small = make_pool(golden_model, pages=3, slots=2, page_entries=8)
    engine = PrefillEngine(golden_model, small, _config(budget=48, chunk=32))
    n = engine.warm_up(4096)
    assert 0 < n < 4096 and small.can_hold(n) and not small.can_hold(2 * n)
    assert not engine.has_work() and small.is_empty()


def _reference_logprobs(logits, ids):
    """Each prompt token after the first, scored by the golden logits of the row before it."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_prompt_logprobs_match_the_golden_rows_in_chunks_beside_a_plain_request(golden_model, golden, monkeypatch):
    """Scored prompts run exact (even on a CED engine), in row-capped chunks, batched beside an
    unscored prompt: every token after the first gets its golden logprob and its top choices."""
    monkeypatch.setattr(prefill_module, "PROMPT_LOGPROBS_ROWS", 24)  # fewer rows than the 32-token chunks
    pool = make_pool(golden_model)
    engine = PrefillEngine(golden_model, pool, _config(budget=64, chunk=32, ced=True))
    scored, plain = golden[3], golden[2]
    engine.add(PrefillRequest("scored", scored["input_ids"].tolist(), prompt_logprobs=3))
    engine.add(PrefillRequest("plain", plain["input_ids"].tolist()))
    done, steps = _drain(engine)
    ids = scored["input_ids"].tolist()
    got = done["scored"].output.prompt_logprobs
    assert steps >= -(-len(ids) // 24) and done["plain"].output.prompt_logprobs is None
    assert [lp.token for lp in got] == ids[1:]
    ref = _reference_logprobs(scored["logits"], ids)
    assert (torch.tensor([lp.logprob for lp in got]) - ref).abs().max() < 0.1
    best = scored["logits"][:-1].argmax(-1).tolist()
    assert all(len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1] for lp in got)
    assert all(lp.top[0][1] >= lp.logprob - 1e-6 for lp in got)  # nothing beats the most likely
    agree = sum(lp.top[0][0] == b for lp, b in zip(got, best))
    assert agree >= 0.95 * len(best)  # near-ties may swap within the logits' tolerance
    assert (done["scored"].output.logits - scored["logits"][-1]).abs().max() < 0.05
    for request in done.values():
        request.cache.release()
    assert pool.is_empty()


def test_prompt_logprobs_refuse_a_cached_prefix(golden_model, golden):
    ids = golden[1]["input_ids"].tolist()
    pool, engine, prefix = _engine_holding(golden_model, ids[:10], budget=64)
    with pytest.raises(PrefillError, match="no cached prefix"):
        engine.add(PrefillRequest("scored", ids, cache=prefix.cache, prompt_logprobs=0))
    with pytest.raises(PrefillError, match="prompt_logprobs"):
        engine.add(PrefillRequest("many", ids, prompt_logprobs=21))
    prefix.cache.release()
    assert pool.is_empty()


def test_a_scored_prompt_is_charged_its_capped_chunk_and_others_move_beside_it(golden_model, golden, monkeypatch):
    """The scheduler charges a scoring job the rows it will run, so a short prompt behind a long
    scored one still finishes in the first step (charged the whole chunk, it waited for every
    one of the scored prompt's capped chunks)."""
    monkeypatch.setattr(prefill_module, "PROMPT_LOGPROBS_ROWS", 8)
    pool = make_pool(golden_model)
    engine = PrefillEngine(golden_model, pool, _config(budget=64, chunk=64))
    engine.add(PrefillRequest("scored", golden[3]["input_ids"].tolist()[:200], prompt_logprobs=0))
    engine.add(PrefillRequest("plain", golden[0]["input_ids"].tolist()))
    first = engine.step()
    assert [r.request_id for r in first] == ["plain"]
    done, steps = _drain(engine)
    assert len(done["scored"].output.prompt_logprobs) == 199 and steps == 200 // 8 - 1
    for request in first + [done["scored"]]:
        request.cache.release()
    assert pool.is_empty()


@pytest.mark.gpu
def test_prompt_logprobs_on_the_kernel_path_match_the_golden_rows(golden_dir, golden):
    """A scored prompt on the GPU (Triton kernels, the pool on the device): every row's logits in
    the capped chunks, each scored chunk in its own forward, within the golden tolerance."""
    model = DeepseekV41.from_checkpoint(golden_dir, device="cuda")
    model.use_kernels()
    layout = CacheLayout.for_model(model.config, page_entries=16)
    pool = CachePool(layout, 600, 4, plain_allocator(model.device))
    engine = PrefillEngine(model, pool, _config(budget=128, chunk=128))
    scored = golden[3]
    ids = scored["input_ids"].tolist()
    engine.add(PrefillRequest("scored", ids, prompt_logprobs=2))
    engine.add(PrefillRequest("plain", golden[2]["input_ids"].tolist()))
    done, _ = _drain(engine)
    got = done["scored"].output.prompt_logprobs
    assert [lp.token for lp in got] == ids[1:] and done["plain"].output.prompt_logprobs is None
    ref = _reference_logprobs(scored["logits"], ids)
    assert (torch.tensor([lp.logprob for lp in got]) - ref).abs().max() < 0.1
    # a rank among near-equal logits moves with the kernels' rounding: it must lie where the
    # golden row puts the token, give or take the logits' tolerance
    rows = scored["logits"][:-1].float()
    for lp, row, t in zip(got, rows, ids[1:]):
        assert int((row > row[t] + 0.1).sum()) + 1 <= lp.rank <= int((row > row[t] - 0.1).sum()) + 1
    for request in done.values():
        request.cache.release()
