"""Workers split over two ranks (`--ranks 2`: two CPU processes over gloo here, `--gpus 0,1`
over NCCL on GPUs): rank 0 serves, rank 1 follows its forwards with its own share of the
weights and its own copy of the KV pool (serving/ranks.py, model/lockstep.py).

DSFLASH_LOCKSTEP_CHECK=1 makes every forward carry a digest of its caches' bytes: a pool
write rank 0 made but did not replicate (a landed transfer, a rollback, a kept copy, the
drafter's rings) stops rank 1, and with it the worker, so these tests fail on it."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch

from dsflash.model.deepseek_v41 import DeepseekV41
from dsflash.model.runner import prompt_logits
from dsflash.serving.ranks import LOST_RANK_EXIT

from .cluster import Worker, generate

pytestmark = pytest.mark.slow
PROMPT = [(7 * i + 3) % 1000 + 5 for i in range(40)]


def _assert_greedy(model, prompt: list[int], tokens: list[int], tolerance: float) -> None:
    """Each token is the one-process model's greedy choice after the tokens before it (within
    `tolerance` of the best logit), the model fed the worker's own tokens."""
    with torch.inference_mode():
        logits = prompt_logits(model, torch.tensor(prompt + tokens)).float().cpu()
    for i, token in enumerate(tokens):
        row = logits[len(prompt) - 1 + i]
        if tolerance == 0:
            assert token == int(row.argmax()), f"token {i}: {token}, greedy {int(row.argmax())}"
        else:
            assert row[token] >= row.max() - tolerance, f"token {i}: {token} is {row.max() - row[token]:.3g} below greedy"


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def two_rank_workers(request, tiny_checkpoint, tmp_path, monkeypatch):
    if request.param == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    monkeypatch.setenv("DSFLASH_LOCKSTEP_CHECK", "1")
    ranks = ["--gpus", "0,1"] if request.param == "cuda" else ["--ranks", "2"]
    prefill = Worker("prefill", tiny_checkpoint, tmp_path, extra=ranks + ["--kv-transports", "tcp"])
    decode = Worker("decode", tiny_checkpoint, tmp_path,
                    extra=ranks + ["--kv-transports", "tcp", "--prefill", prefill.address,
                           "--max-requests", "2"])  # few slots: later requests reuse zeroed ones
    try:
        prefill.wait_ready(120)
        decode.wait_ready(120)
        yield prefill, decode, request.param
    finally:
        prefill.stop()
        decode.stop()


def test_two_rank_workers_match_one_process(two_rank_workers, tiny_checkpoint):
    prefill, decode, device = two_rank_workers
    for worker in (prefill, decode):
        assert "ranks=2" in worker.log_path.read_text() and "rank_ready rank=1" in worker.log_path.read_text()
    model = DeepseekV41.from_checkpoint(tiny_checkpoint, device=device)
    if device == "cuda":
        model.use_kernels()
    # turn 1: prefilled by the prefill worker's two ranks, handed over TCP to rank 0 of the
    # decode worker (rank 1 gets the landed bytes), decoded with drafts and rollbacks
    out, finished = generate(decode.address, PROMPT, conversation="c", max_tokens=10, ignore_eos=True,
                             temperature=0, timeout_s=120)
    assert finished.stats.prefill_worker == prefill.address and finished.stats.transport == "tcp"
    # turn 2 continues the cache the decode worker kept
    turn2 = PROMPT + out + [11, 12, 13]
    out2, finished2 = generate(decode.address, turn2, conversation="c", max_tokens=8, ignore_eos=True,
                               temperature=0, timeout_s=120)
    assert finished2.usage.cached_tokens > len(PROMPT)
    # the prefill worker gone, prompts are computed here; more requests than slots, so each
    # takes a slot another cache left (zeroed on both ranks)
    # two at once: while both run, a forward carries both caches' views (continuous batching)
    pair = [[(13 * i + k) % 700 + 9 for i in range(25 + 4 * k)] for k in range(2)]
    with ThreadPoolExecutor(2) as pool:
        pair_outs = list(pool.map(lambda p: generate(decode.address, p, max_tokens=8, ignore_eos=True, temperature=0,
                                                     timeout_s=120)[0], pair))
    prefill.stop()
    others = [[(5 * i + k) % 900 + 7 for i in range(20 + k)] for k in range(3)]
    outs = [generate(decode.address, p, max_tokens=4, ignore_eos=True, temperature=0, timeout_s=120)[0]
            for p in others]
    # On CPU the sums of two ranks round like one process's here; on GPUs their order moves
    # logits by ~1e-3, enough to swap the tiny random model's near-ties.
    # The FP8/FP4 cache quantizers can turn such a difference into a whole quantization step of
    # a cached entry (measured: 0.07 on one H200 pair); a wrong cache moves logits by units.
    tolerance = 0.0 if device == "cpu" else 0.25
    for prompt, tokens in [(PROMPT, out), (turn2, out2)] + list(zip(pair, pair_outs)) + list(zip(others, outs)):
        _assert_greedy(model, prompt, tokens, tolerance)
    assert decode.process.poll() is None, decode.log()
    assert decode.terminate() == 0, decode.log()  # SIGTERM: drains, stops rank 1, exits


def test_ced_prefill_over_two_ranks_equals_one_rank(tiny_checkpoint, tmp_path, monkeypatch):
    """The CED prefill's encoder and decoder passes (the decoder's input streams broadcast to
    the other rank), in several chunks, then decode: the same tokens as one-rank workers."""
    monkeypatch.setenv("DSFLASH_LOCKSTEP_CHECK", "1")
    prompt = [(11 * i + 5) % 3000 + 3 for i in range(150)]  # longer than the decoder's tail (13)
    outputs = []
    for ranks in (["--ranks", "2"], []):
        prefill = Worker("prefill", tiny_checkpoint, tmp_path, extra=ranks + [
            "--kv-transports", "tcp", "--ced", "--prefill-token-budget", "64"])
        decode = Worker("decode", tiny_checkpoint, tmp_path, extra=ranks + [
            "--kv-transports", "tcp", "--prefill", prefill.address])
        try:
            prefill.wait_ready(120)
            decode.wait_ready(120)
            out, finished = generate(decode.address, prompt, max_tokens=6, ignore_eos=True, temperature=0,
                                     timeout_s=120)
            assert finished.stats.prefill_worker == prefill.address
            outputs.append(out)
        finally:
            prefill.stop()
            decode.stop()
    assert outputs[0] == outputs[1]


def test_a_lost_rank_ends_the_worker_instead_of_hanging(two_rank_workers):
    _, decode, _ = two_rank_workers
    followers = _children(decode.process.pid)
    assert followers, "rank 1 is a child of the worker process"
    for pid in followers:
        os.kill(pid, 9)
    began = time.monotonic()
    assert decode.process.wait(30) == LOST_RANK_EXIT
    assert time.monotonic() - began < 30
    assert "rank_lost" in decode.log_path.read_text()
    with pytest.raises(grpc.RpcError):
        generate(decode.address, PROMPT, max_tokens=2, timeout_s=10)


def test_gpus_too_small_for_a_ranks_weights_stop_the_worker_before_any_rank_starts(tiny_checkpoint, monkeypatch):
    """The refusal is rank 0's own error, raised before a child exists (a child's would reach
    the operator as a lost rank)."""
    import multiprocessing

    from dsflash.serving.ranks import Ranks

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 << 10, 1 << 20))
    before = len(multiprocessing.active_children())
    with pytest.raises(ValueError, match=r"each of 2 rank\(s\) holds [\d.]+ GiB of decode weights, but cuda:0 has"):
        Ranks(["cuda:0", "cuda:1"], str(tiny_checkpoint), "decode")
    assert len(multiprocessing.active_children()) == before
