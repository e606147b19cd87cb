"""The block hashes behind the directory's prefix index: chained, deterministic across
processes (unlike Python's salted hash()), and pinned so a change of algorithm is noticed
(it would orphan every prefix entry a running deployment recorded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dsflash.kvcache.prefix_hash import block_hashes, prefix_hash


def test_hashes_are_pinned():
    assert block_hashes(list(range(40)), 16) == ["a282414a8adb1da84516c1854027c205", "c79c628e797c41dab061923ca04c63ec"]
    assert prefix_hash([1, 2, 3]) == "307bd076bc70a31be5bebf632de7231b"


def test_same_in_another_process_with_another_hash_seed():
    code = (
        "import json; from dsflash.kvcache.prefix_hash import block_hashes as b;"
        "print(json.dumps(b(list(range(100)), 8)))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == block_hashes(list(range(100)), 8)


def test_hash_i_covers_every_token_up_to_block_i():
    base = list(range(64))
    hashes = block_hashes(base, 16)
    assert len(hashes) == 4 and len(set(hashes)) == 4
    changed_early = block_hashes([999] + base[1:], 16)  # a change in block 0 changes every hash
    assert all(a != b for a, b in zip(hashes, changed_early))
    changed_late = block_hashes(base[:40] + [999] + base[41:], 16)  # block 2 onwards differ
    assert changed_late[:2] == hashes[:2] and all(a != b for a, b in zip(hashes[2:], changed_late[2:]))
    # The partial tail is left out; appending tokens only appends hashes.
    assert block_hashes(base + [1, 2, 3], 16) == hashes
    assert block_hashes(base + list(range(16)), 16)[:4] == hashes
    assert block_hashes(base[:15], 16) == []


def test_block_size_is_part_of_the_hash():
    tokens = list(range(64))
    assert block_hashes(tokens, 32)[0] not in block_hashes(tokens, 16)
    assert block_hashes(tokens, 16)[1] != block_hashes(tokens, 32)[0]  # same tokens, other block size


def test_prefix_hash_covers_length_and_content():
    assert prefix_hash([1, 2, 3]) == prefix_hash((1, 2, 3))
    assert len({prefix_hash([]), prefix_hash([0]), prefix_hash([0, 0]), prefix_hash([1, 2, 4])}) == 4


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5]])
def test_rejects_values_that_are_not_token_ids(bad):
    with pytest.raises(ValueError):
        block_hashes(bad * 4, 4)
    with pytest.raises(ValueError):
        prefix_hash(bad)


def test_rejects_a_nonpositive_block_size():
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], 0)
