"""The tiers as real processes: redis-server, one prefill worker, two decode workers, gRPC.

Each test states the failure it guards against (peers.md §7: dead peers hanging the other
side, stranded KV, failed transfers answered as success, lost ownership)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dsflash.decode_worker.engine import DecodeEngine, DecodeEngineConfig
from dsflash.decode_worker.request import DecodeRequest
from dsflash.decode_worker.sampling import SamplingParams
from dsflash.kvcache.directory import RedisDirectory
from dsflash.kvcache.layout import CacheLayout
from dsflash.kvcache.pool import CachePool
from dsflash.model.runner import greedy
from dsflash.v1 import worker_pb2, worker_pb2_grpc

from .cluster import Worker, generate, wait_for

pytestmark = pytest.mark.slow


class Cluster:
    def __init__(self, checkpoint, log_dir, redis_url, prefill_extra=(), decode_extra=()):
        self.redis_url = redis_url
        self.prefill = Worker("prefill", checkpoint, log_dir, redis_url, list(prefill_extra))
        self.decodes = [Worker("decode", checkpoint, log_dir, redis_url, list(decode_extra)) for _ in range(2)]
        try:
            for w in [self.prefill] + self.decodes:
                w.wait_ready()
            # the decode workers find the prefill worker through Redis registrations
            wait_for(lambda: self.decodes[0].status().worker_id and self.prefill.status().worker_id)
        except BaseException:
            self.stop()  # a failed setup must not leave workers behind
            raise

    def stop(self):
        for w in [self.prefill] + self.decodes:
            w.stop()


@pytest.fixture(scope="module")
def redis_module(tmp_path_factory):
    from tests.support.redis_server import start_redis

    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(tiny_checkpoint, redis_module, tmp_path_factory):
    c = Cluster(tiny_checkpoint, tmp_path_factory.mktemp("logs"), redis_module.url)
    yield c
    c.stop()


def _prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 120000, (n,), generator=g).tolist()


def test_output_equals_the_single_process_engine(cluster, tiny_model):
    prompt = _prompt(37, 1)
    out, finished = generate(cluster.decodes[0].address, prompt, max_tokens=10, temperature=0)
    with torch.inference_mode():
        assert out == greedy(tiny_model, torch.tensor(prompt), 10)
    assert finished.finish_reason == "length" and finished.usage.computed_tokens == 37
    assert finished.stats.prefill_worker == cluster.prefill.address and finished.stats.transport in ("shm", "tcp")
    # a seeded sampled request too: the same tokens as the engine in this process
    params = dict(temperature=0.8, top_p=0.9, seed=7)
    out, _ = generate(cluster.decodes[1].address, prompt, max_tokens=10, **params)
    pool = CachePool(CacheLayout.for_model(tiny_model.config, page_entries=64), 300, 4)
    engine = DecodeEngine(tiny_model, pool, DecodeEngineConfig())
    request = DecodeRequest("x", prompt, SamplingParams(max_tokens=10, **params))
    engine.add(request)
    while engine.has_work():
        engine.step()
    assert out == request.output


def test_conversation_alternating_workers_fetches_instead_of_recomputing(cluster, tiny_model):
    computed_before = cluster.prefill.status().computed_prefill_tokens_total
    prompt, conv = _prompt(30, 2), "conv-alternating"
    new_tokens = [30]
    out, finished = generate(cluster.decodes[0].address, prompt, conversation=conv)
    assert finished.usage.cached_tokens == 0 and finished.stats.cache_source == "none"
    for turn, worker in enumerate([cluster.decodes[1], cluster.decodes[0]], start=2):
        held = len(prompt) + len(out) - 1  # the previous turn's cache: prompt and outputs but the last
        prompt = prompt + out + _prompt(9 + turn, turn)
        new_tokens.append(len(prompt) - held)
        wait_for(lambda: _owner_holds(cluster, conv, held))
        out, finished = generate(worker.address, prompt, conversation=conv)
        assert finished.stats.cache_source == "peer", turn
        assert finished.usage.cached_tokens == held and finished.usage.computed_tokens == len(prompt) - held
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
    assert cluster.prefill.status().computed_prefill_tokens_total - computed_before == sum(new_tokens)


def test_thinking_turn_keeps_the_prompt_before_its_closing_token(cluster, tiny_model):
    """Thinking without tools: the next prompt drops the reply's reasoning, so it extends the
    prompt minus its last token (the `<think>`), never the reply. The conversation keeps that."""
    conv = "conv-thinking"
    computed_before = cluster.prefill.status().computed_prefill_tokens_total
    prompt = _prompt(41, 11)
    out, finished = generate(cluster.decodes[0].address, prompt, conversation=conv, history_drops_reply=True)
    assert finished.usage.cached_tokens == 0 and finished.usage.computed_tokens == len(prompt)
    with torch.inference_mode():  # the prompt computed in two steps decodes as in one
        assert out == greedy(tiny_model, torch.tensor(prompt), 8)
    for turn, worker in enumerate([cluster.decodes[1], cluster.decodes[0]], start=2):
        held = len(prompt) - 1
        prompt = prompt[:-1] + _prompt(7 + turn, 11 + turn)
        wait_for(lambda: _owner_holds(cluster, conv, held))
        out, finished = generate(worker.address, prompt, conversation=conv, history_drops_reply=True)
        assert finished.stats.cache_source == "peer", turn
        assert finished.usage.cached_tokens == held and finished.usage.computed_tokens == len(prompt) - held
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
    # the prefill worker computed what was new in each prompt, all but its last token
    assert cluster.prefill.status().computed_prefill_tokens_total - computed_before == 40 + (9 - 1) + (10 - 1)


def _owner_holds(cluster, conv, num_tokens):
    """The last turn's owner has recorded its cache. The claim is written after the reply is
    sent; a turn sent before it lands reuses less (the older owner's cache), never wrong data."""
    async def look():
        d = RedisDirectory.from_url(cluster.redis_url)
        try:
            return await d.lookup(conv)
        finally:
            await d.close()

    record = asyncio.run(look())
    return record is not None and record.num_cached_tokens == num_tokens


def test_health_and_reflection_answer_standard_clients(cluster):
    for worker, service in [(cluster.prefill, "dsflash.v1.Prefill"), (cluster.decodes[0], "dsflash.v1.Decode")]:
        with grpc.insecure_channel(worker.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == 1
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = {s.name for r in replies for s in r.list_services_response.service}
            assert {service, "grpc.health.v1.Health"} <= names


def test_client_cancel_releases_both_tiers(cluster):
    decode = cluster.decodes[1]
    before = decode.status()
    request = worker_pb2.GenerateRequest(request_id="to-cancel", token_ids=_prompt(40, 5),
                                         sampling=worker_pb2.SamplingParams(max_tokens=500, temperature=0,
                                                                            ignore_eos=True))
    with grpc.insecure_channel(decode.address) as channel:
        call = worker_pb2_grpc.DecodeStub(channel).Generate(request)
        next(iter(call))  # the first token arrived: prefill done, decoding runs
        call.cancel()
    # The status is read while the engine may be between taking the request off its running
    # list and releasing its cache (seen once in 2026-12-02's runs: a slot short), so wait for
    # the counts; a leaked page or slot times out.
    wait_for(lambda: (s := decode.status()).running_requests == 0 and s.waiting_requests == 0
             and s.free_pages == before.free_pages and s.free_slots == before.free_slots)
    prefill = cluster.prefill.status()
    assert prefill.free_pages == prefill.total_pages


def test_device_pools_stage_every_handoff_through_their_host_copies(tiny_checkpoint, redis_server, tmp_path,
                                                                    tiny_model):
    """`--kv-pool device` on CPU: the model's buffers apart from the transfer segments, as on a
    GPU. Every way a cache moves stages it: prefill -> decode (prefill's device -> host, decode's
    host -> device), and a later turn on the other decode worker (the owner's device -> host,
    the prefill worker's host -> device for the prefix it extends)."""
    place = ["--kv-pool", "device"]
    c = Cluster(tiny_checkpoint, tmp_path, redis_server.url, prefill_extra=place, decode_extra=place)
    try:
        for worker in [c.prefill] + c.decodes:
            assert "pool_device=cpu pool_staging=host" in worker.log_path.read_text(), worker.log()
        prompt, conv = _prompt(30, 13), "conv-device-pools"
        out, finished = generate(c.decodes[0].address, prompt, conversation=conv)
        assert finished.stats.cache_source == "none" and finished.usage.computed_tokens == len(prompt)
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
        held = len(prompt) + len(out) - 1
        prompt = prompt + out + _prompt(11, 14)
        wait_for(lambda: _owner_holds(c, conv, held))
        out, finished = generate(c.decodes[1].address, prompt, conversation=conv)
        assert finished.stats.cache_source == "peer" and finished.usage.cached_tokens == held
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
    finally:
        c.stop()


def test_owner_killed_between_turns_recomputes(tiny_checkpoint, redis_server, tmp_path, tiny_model):
    c = Cluster(tiny_checkpoint, tmp_path, redis_server.url)
    try:
        prompt, conv = _prompt(25, 6), "conv-owner-dies"
        out, _ = generate(c.decodes[0].address, prompt, conversation=conv)
        wait_for(lambda: _owner_holds(c, conv, len(prompt) + len(out) - 1))
        c.decodes[0].kill()  # its registration and ownership stay in Redis for up to their TTLs
        prompt = prompt + out + _prompt(7, 7)
        out, finished = generate(c.decodes[1].address, prompt, conversation=conv, timeout_s=60)
        assert finished.usage.cached_tokens == 0 and finished.usage.computed_tokens == len(prompt)
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
    finally:
        c.stop()


def test_corrupted_transfer_is_detected_and_recomputed(tiny_checkpoint, redis_server, tmp_path, tiny_model):
    c = Cluster(tiny_checkpoint, tmp_path, redis_server.url, prefill_extra=["--inject-kv-fault", "corrupt:100"])
    try:
        prompt = _prompt(33, 8)
        out, finished = generate(c.decodes[0].address, prompt)
        assert finished.stats.cache_source == "recompute"  # the corrupted handoff was refused
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
        assert c.prefill.status().handoff_failures_total == 1
        assert c.decodes[0].status().handoff_failures_total == 1
        out2, finished2 = generate(c.decodes[0].address, prompt)  # the fault was one-shot
        assert out2 == out and finished2.stats.cache_source == "none"
    finally:
        c.stop()


def test_decode_killed_mid_handoff_frees_prefill_pages(tiny_checkpoint, redis_server, tmp_path):
    c = Cluster(tiny_checkpoint, tmp_path, redis_server.url, prefill_extra=["--inject-kv-fault", "delay:3"])
    try:
        total = c.prefill.status().total_pages
        errors = []

        def client():
            try:
                generate(c.decodes[0].address, _prompt(60, 9), timeout_s=30)
            except grpc.RpcError as exc:
                errors.append(exc.code())

        thread = threading.Thread(target=client)
        thread.start()
        wait_for(lambda: c.prefill.status().free_pages < total)  # the cache is built, the push is stalling
        c.decodes[0].kill()
        began = time.monotonic()
        wait_for(lambda: c.prefill.status().free_pages == total, timeout_s=15)
        assert time.monotonic() - began < 10  # seconds, not minutes
        thread.join(30)
        assert errors == [grpc.StatusCode.UNAVAILABLE]
    finally:
        c.stop()


def test_redis_outage_degrades_to_local_ownership_and_recovers(tiny_checkpoint, redis_server, tmp_path, tiny_model):
    c = Cluster(tiny_checkpoint, tmp_path, redis_server.url)
    try:
        prompt, conv = _prompt(20, 10), "conv-redis-outage"
        out, _ = generate(c.decodes[0].address, prompt, conversation=conv)
        redis_server.stop()
        time.sleep(1.2)  # past the decode worker's 1 s refresh of its prefill-worker list
        # everything keeps working: the decode worker knows its own conversations locally
        prompt = prompt + out + _prompt(5, 11)
        out, finished = generate(c.decodes[0].address, prompt, conversation=conv, timeout_s=60)
        assert finished.stats.cache_source == "local" and finished.usage.cached_tokens > 0
        with torch.inference_mode():
            assert out == greedy(tiny_model, torch.tensor(prompt), 8)
        assert wait_for(lambda: c.decodes[0].status().directory_degraded)
        redis_server.start()  # empty: the records come back from the workers

        async def record():
            d = RedisDirectory.from_url(redis_server.url)
            try:
                return await d.lookup(conv)
            finally:
                await d.close()

        rec = wait_for(lambda: asyncio.run(record()), timeout_s=20, interval_s=0.5)
        assert rec.num_cached_tokens == len(prompt) + len(out) - 1
        assert wait_for(lambda: not c.decodes[0].status().directory_degraded, timeout_s=20)
    finally:
        c.stop()


def test_sigterm_drains_then_exits(tiny_checkpoint, redis_server, tmp_path):
    # (a grace longer than the default: a loaded CI machine took over 30 s for the 40 tokens)
    c = Cluster(tiny_checkpoint, tmp_path, redis_server.url, decode_extra=["--drain-grace-s", "120"])
    try:
        results = []
        thread = threading.Thread(target=lambda: results.append(
            generate(c.decodes[0].address, _prompt(15, 12), max_tokens=40, ignore_eos=True, temperature=0)))
        thread.start()
        wait_for(lambda: c.decodes[0].status().running_requests == 1)
        c.decodes[0].process.send_signal(signal.SIGTERM)
        # it leaves the registry at once, so gateways stop routing to it while the request runs on
        assert wait_for(lambda: c.decodes[0].address not in _registered(redis_server.url), timeout_s=5)
        assert c.decodes[0].status().running_requests == 1
        assert c.decodes[0].process.wait(120) == 0
        thread.join(30)
        assert len(results) == 1 and len(results[0][0]) == 40  # the running request finished
        assert "worker_stopped" in c.decodes[0].log()
    finally:
        c.stop()


def _registered(redis_url: str) -> set[str]:
    """Addresses of the workers the directory lists right now."""
    from dsflash.kvcache.directory import DirectoryConfig, open_directory

    async def addresses():
        directory = open_directory(DirectoryConfig(redis_url=redis_url))
        try:
            return {w.address for w in await directory.list_workers()}
        finally:
            await directory.close()

    return asyncio.run(addresses())
