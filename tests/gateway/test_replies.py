"""A reply quoted back in the history is encoded with the ids the model generated for it.

Why it matters: the decode worker cached the generated ids, and the next turn reuses that
cache only if its prompt starts with exactly those ids. Tokenizing the quoted text again may
spell it differently. These tests build such a reply by hand (the same text, other ids)."""

from __future__ import annotations

from dsflash.gateway import special_tokens as st
from dsflash.gateway.chat_encoding import encode_chat, render_chat
from dsflash.gateway.replies import ReplyMemory

USER = [{"role": "user", "content": "Name a colour."}]


def _odd_spelling(tokenizer, text: str) -> list[int]:
    """`text` encoded in two pieces cut where that changes the ids: the same string, other ids
    than encoding it whole (as a sampled reply often is)."""
    whole = tokenizer.encode_texts([text])[0]
    for cut in range(1, len(text)):
        ids = tokenizer.encode_texts([text[:cut]])[0] + tokenizer.encode_texts([text[cut:]])[0]
        if ids != whole:
            assert tokenizer.decode(ids) == text
            return ids
    raise AssertionError(f"every cut of {text!r} tokenizes like the whole")


def _turn_two(reply: dict) -> list[dict]:
    return USER + [reply, {"role": "user", "content": "Another."}]


def test_quoted_reply_keeps_the_generated_ids(tokenizer):
    text = "Ultramarine, a deep blue."
    generated = _odd_spelling(tokenizer, text)
    first = encode_chat(tokenizer, USER, thinking=False).token_ids
    memory = ReplyMemory()
    memory.remember(tokenizer.decode(generated), generated)

    plain = encode_chat(tokenizer, _turn_two({"role": "assistant", "content": text}), thinking=False)
    spliced = encode_chat(tokenizer, _turn_two({"role": "assistant", "content": text}), thinking=False,
                          replies=memory.lookup)
    cached = first + generated  # what the decode worker holds after turn one
    assert spliced.token_ids[:len(cached)] == cached
    assert plain.token_ids[:len(cached)] != cached  # the limit this removes
    assert spliced.token_ids[len(cached)] == st.EOS.id
    # the same prompt text either way: only the reply's spelling differs
    assert spliced.rendered.text() == plain.rendered.text()
    assert tokenizer.decode(spliced.token_ids) == tokenizer.decode(plain.token_ids)


def test_reasoning_kept_in_history_is_part_of_the_match(tokenizer):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    reasoning, content = "The user wants one colour.", "Teal."
    generated = (_odd_spelling(tokenizer, reasoning) + [st.THINK_END.id]
                 + tokenizer.encode_texts([content])[0])
    memory = ReplyMemory()
    memory.remember(tokenizer.decode(generated), generated)
    reply = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    # with tools the history keeps reasoning, so the body is reasoning + </think> + content
    ids = encode_chat(tokenizer, _turn_two(reply), tools=tools, replies=memory.lookup).token_ids
    assert _contains(ids, generated + [st.EOS.id])
    # without tools, thinking drops that reasoning: the body is only "Teal.", no match
    ids = encode_chat(tokenizer, _turn_two(reply), replies=memory.lookup).token_ids
    assert not _contains(ids, generated)


def test_text_that_differs_is_tokenized_as_usual(tokenizer):
    generated = _odd_spelling(tokenizer, "Crimson.")
    memory = ReplyMemory()
    memory.remember("Crimson.", generated)
    messages = _turn_two({"role": "assistant", "content": "Crimson. "})
    assert (encode_chat(tokenizer, messages, thinking=False, replies=memory.lookup).token_ids
            == encode_chat(tokenizer, messages, thinking=False).token_ids)


def test_final_assistant_prefix_is_spliced_without_eos(tokenizer):
    generated = _odd_spelling(tokenizer, "Once upon a time")
    memory = ReplyMemory()
    memory.remember("Once upon a time", generated)
    messages = USER + [{"role": "assistant", "content": "Once upon a time"}]
    ids = encode_chat(tokenizer, messages, thinking=False, replies=memory.lookup).token_ids
    assert ids[-len(generated):] == generated
    assert render_chat(messages, thinking=False, replies=memory.lookup).text().endswith("Once upon a time")


def test_memory_is_bounded_by_tokens_least_recently_used_first():
    memory = ReplyMemory(max_tokens=10)
    memory.remember("a", [1, 2, 3, 4])
    memory.remember("b", [5, 6, 7, 8])
    assert memory.lookup("a") == (1, 2, 3, 4)  # "a" is now the most recent
    memory.remember("c", [9, 10, 11])
    assert memory.lookup("b") is None and memory.lookup("a") and memory.lookup("c")
    assert memory.held_tokens == 7
    memory.remember("a", [1])  # replacing an entry gives its tokens back
    assert memory.held_tokens == 4 and len(memory) == 2
    memory.remember("huge", list(range(11)))  # more than the whole budget: not kept
    assert memory.lookup("huge") is None


def _contains(ids: list[int], run: list[int]) -> bool:
    return any(ids[i:i + len(run)] == run for i in range(len(ids) - len(run) + 1))
