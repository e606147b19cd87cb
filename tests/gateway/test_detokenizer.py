"""Streaming detokenizer: whole characters, whole special tokens, stop strings across tokens."""

from __future__ import annotations

import pytest

from dsflash.gateway import special_tokens as st
from dsflash.gateway.detokenizer import StreamingDetokenizer

MIXED = "naïve 中文 😀👍🏽 Ελληνικά — ok"


def _pieces(detok: StreamingDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids] + [detok.finish()]


def test_multibyte_text_and_emoji_come_out_whole(tokenizer):
    ids = tokenizer.encode_text(MIXED)
    pieces = _pieces(StreamingDetokenizer(tokenizer), ids)
    assert "".join(pieces) == MIXED
    assert not any("\ufffd" in p for p in pieces)
    # The emoji spans two tokens: nothing is shown for the first, the whole emoji with the second.
    emoji = tokenizer.encode_text("😀")
    assert _pieces(StreamingDetokenizer(tokenizer), emoji) == ["", "😀", ""]


def _stream_with_specials(tokenizer) -> tuple[list[int], str]:
    ids = [st.THINK_START.id, *tokenizer.encode_text("思考😀"), st.THINK_END.id, *tokenizer.encode_text("é"),
           st.DSML.id, *tokenizer.encode_text(" calls👍🏽"), st.SYSTEM.id, st.EOS.id]
    return ids, "<think>思考😀</think>é｜DSML｜ calls👍🏽<｜System｜>"


def test_split_at_every_position_gives_the_same_text_and_whole_special_tokens(tokenizer):
    ids, expected = _stream_with_specials(tokenizer)
    for cut in range(len(ids) + 1):
        detok = StreamingDetokenizer(tokenizer)
        first, second = detok.push_many(ids[:cut]), detok.push_many(ids[cut:]) + detok.finish()
        assert first + second == expected, cut
        assert "\ufffd" not in first + second
    detok = StreamingDetokenizer(tokenizer)
    for token_id in ids:
        out = detok.push(token_id)
        if tokenizer.is_special(token_id) and token_id not in st.HIDDEN_IDS:
            assert st.BY_ID[token_id].text in out  # a special token is always emitted in one piece


def test_a_broken_character_before_a_special_token_becomes_a_replacement_char(tokenizer):
    first_half_of_emoji = tokenizer.encode_text("😀")[0]
    detok = StreamingDetokenizer(tokenizer)
    assert detok.push(first_half_of_emoji) == ""
    assert detok.push(st.THINK_END.id) == "\ufffd</think>"


def test_hidden_tokens_are_not_shown(tokenizer):
    detok = StreamingDetokenizer(tokenizer)
    assert detok.push_many([st.BOS.id, *tokenizer.encode_text("hi"), st.EOS.id]) + detok.finish() == "hi"
    assert StreamingDetokenizer(tokenizer, hidden_ids=()).push(st.EOS.id) == "<｜end▁of▁sentence｜>"


@pytest.mark.parametrize("stop", ["STOP", "world. ST", "<|end|>", "|>y"])
def test_stop_strings_spanning_tokens_cut_the_text_before_them(tokenizer, stop):
    text = "Hello world. STOP here x<|end|>y tail"
    ids = tokenizer.encode_text(text)
    for cut in range(len(ids) + 1):
        detok = StreamingDetokenizer(tokenizer, stop=[stop, "never"])
        out = detok.push_many(ids[:cut]) + detok.push_many(ids[cut:]) + detok.finish()
        assert out == text[:text.index(stop)], (stop, cut)
        assert detok.is_stopped and detok.matched_stop == stop
    detok = StreamingDetokenizer(tokenizer, stop=[stop])
    emitted = ""
    for token_id in ids:
        emitted += detok.push(token_id)
        assert text[:text.index(stop)].startswith(emitted)  # no piece of the stop string ever leaks


def test_earliest_stop_wins_and_later_tokens_are_ignored(tokenizer):
    detok = StreamingDetokenizer(tokenizer, stop=["here", "world"])
    out = detok.push_many(tokenizer.encode_text("Hello world. STOP here"))
    assert (out, detok.matched_stop) == ("Hello ", "world")
    assert detok.push_many(tokenizer.encode_text("more")) + detok.finish() == ""


def test_a_possible_stop_start_is_held_back_then_released(tokenizer):
    detok = StreamingDetokenizer(tokenizer, stop=["STOP!"])
    ids = tokenizer.encode_text("abc STOP")
    assert detok.push_many(ids) == "abc "
    assert detok.push_many(tokenizer.encode_text(" go")) == "STOP go"
    assert detok.finish() == "" and not detok.is_stopped
    detok = StreamingDetokenizer(tokenizer, stop=["STOP!"])
    assert detok.push_many(ids) + detok.finish() == "abc STOP"


def test_special_tokens_are_barriers_for_stop_strings(tokenizer):
    ids = [*tokenizer.encode_text("a ST"), st.THINK_END.id, *tokenizer.encode_text("OP think")]
    detok = StreamingDetokenizer(tokenizer, stop=["STOP", "think>"])
    assert detok.push_many(ids) + detok.finish() == "a ST</think>OP think"
    assert not detok.is_stopped


def test_stop_strings_can_wait_for_the_end_of_reasoning(tokenizer):
    ids = [*tokenizer.encode_text("plan\n\nmore"), st.THINK_END.id, *tokenizer.encode_text("answer\n\nnext")]
    detok = StreamingDetokenizer(tokenizer, stop=["\n\n"], stop_after_token=st.THINK_END.id)
    assert detok.push_many(ids) + detok.finish() == "plan\n\nmore</think>answer"
    assert detok.matched_stop == "\n\n"


def test_stop_strings_count_only_after_min_tokens(tokenizer):
    head, tail = tokenizer.encode_text("a, b"), tokenizer.encode_text(", c, d")
    for held in (0, len(head)):
        detok = StreamingDetokenizer(tokenizer, stop=[","], min_tokens=held)
        text = detok.push_many(head + tail) + detok.finish()
        assert text == ("a" if held == 0 else "a, b") and detok.matched_stop == ","
    # one that starts in the held-off text and a later token ends counts, as the worker counts it
    head = tokenizer.encode_text("hello world")
    detok = StreamingDetokenizer(tokenizer, stop=["world STOP"], min_tokens=len(head))
    assert detok.push_many(head + tokenizer.encode_text(" STOP now")) + detok.finish() == "hello "
