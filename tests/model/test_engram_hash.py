"""Engram n-gram hashing (model/engram_hash.py): a decode step hashes all its runs in one pass,
and that pass gives each run what it gets alone; a run hashed in chunks, each with the ids
before it as history, gives what the whole run gives."""

import torch

from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig
from dsflash.model.engram_hash import EngramHasher, compressed_map


def _hasher(golden_dir) -> EngramHasher:
    config = ModelConfig.from_dict(preset_config("tiny"))
    return EngramHasher(config, compressed_map(str(golden_dir / "tokenizer.json")))


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 129000, (n,), generator=torch.Generator().manual_seed(seed))


def test_runs_hashed_together_equal_each_alone(golden_dir):
    hasher = _hasher(golden_dir)
    for lengths in ([6, 6, 6, 6], [6, 1, 13]):  # one pass; mixed lengths run by run
        runs = [(_ids(n, seed), _ids(seed, 100 + seed).tolist()) for seed, n in enumerate(lengths)]  # histories 0..
        together = hasher.many(runs)
        alone = torch.cat([hasher(tokens, history) for tokens, history in runs])
        assert together.shape == (sum(lengths), 2, hasher.offsets.shape[1])
        assert torch.equal(together, alone)


def test_chunks_with_their_history_equal_the_whole_run(golden_dir):
    hasher = _hasher(golden_dir)
    ids = _ids(40, 7)
    whole = hasher(ids, [])
    parts = [hasher(ids[a:b], ids[:a].tolist()) for a, b in ((0, 1), (1, 3), (3, 17), (17, 40))]
    assert torch.equal(torch.cat(parts), whole)
    # an n-gram reaching before the sequence start is blocked: the first rows differ from a
    # run that had history before it
    assert not torch.equal(hasher(ids[3:6], []), whole[3:6])


def test_device_form_equals_the_host_form(golden_dir):
    """RunHashes' device inputs hashed by on_device (torch ops, as in a decode step's CUDA graph)
    give many's ids bit for bit, for runs of mixed lengths at and away from the sequence start."""
    from dsflash.model.batch import SeqRun, pack
    from dsflash.model.engram_hash import RunHashes

    hasher = _hasher(golden_dir)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for lengths, history in (([6, 6, 6], [0, 1, 2]), ([1, 13, 4, 40], [0, 5, 1, 2])):
        runs = [SeqRun(cache=None, tokens=_ids(n, seed), start=h, history=_ids(h, 50 + seed).tolist())
                for seed, (n, h) in enumerate(zip(lengths, history))]
        hashes = RunHashes(hasher, runs, pack(runs))
        for device in devices:
            inputs = hashes.device_inputs(torch.device(device))
            for slot in range(hasher.num_layers):
                assert torch.equal(hasher.on_device(*inputs, slot).cpu(), hashes.ids[:, slot])
