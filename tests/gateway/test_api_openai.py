"""The whole stack through the official `openai` client: `dsflash serve` (gateway, prefill and
decode workers, real model) on loopback."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import torch

from dsflash.gateway.tokenizer import load_tokenizer
from dsflash.model.runner import greedy, prompt_logits
from tests.support.gateway_harness import ServeProcess

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Write one word."}]


@pytest.fixture(scope="module")
def serve(tiny_checkpoint, tmp_path_factory):
    process = ServeProcess(tiny_checkpoint, tmp_path_factory.mktemp("serve") / "serve.log")
    yield process
    process.close()


@pytest.fixture
def client(serve):
    return openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0)


def test_models_health_ready(serve, client):
    assert "ops=reference" in serve.log_path.read_text()  # on the CPU (`--device cuda`: the kernels)
    assert [m.id for m in client.models.list().data] == ["deepseek-v4.1-flash"]
    assert httpx.get(f"{serve.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{serve.url}/readyz").status_code == 200
    canary = httpx.get(f"{serve.url}/health_generate", timeout=60)  # a token through both tiers
    assert canary.status_code == 200 and canary.json()["prefill_worker"] and canary.json()["decode_worker"]


def test_chat_thinking_on_and_off(client):
    on = client.chat.completions.create(model="m", messages=USER, max_tokens=6)
    choice = on.choices[0]
    assert choice.finish_reason == "length" and on.usage.completion_tokens == 6
    assert choice.message.model_extra.get("reasoning_content")  # thinking is on by default: output starts as reasoning
    assert on.usage.completion_tokens_details.reasoning_tokens == 6
    off = client.chat.completions.create(model="m", messages=USER, max_tokens=6,
                                         extra_body={"thinking": {"type": "disabled"}})
    assert off.choices[0].message.content and not off.choices[0].message.model_extra.get("reasoning_content")
    assert off.usage.prompt_tokens < on.usage.prompt_tokens  # no reasoning-effort prefix


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(model="m", messages=USER, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"thinking": {"type": "disabled"}})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"] and chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    whole = client.chat.completions.create(model="m", messages=USER, max_tokens=5, temperature=0,
                                           extra_body={"thinking": {"type": "disabled"}})
    again = client.chat.completions.create(model="m", messages=USER, max_tokens=5, temperature=0, stream=True,
                                           extra_body={"thinking": {"type": "disabled"}})
    assert "".join(c.choices[0].delta.content or "" for c in again if c.choices) == whole.choices[0].message.content
    assert text  # the sampled stream produced text too


def test_logprobs_and_n(client):
    out = client.chat.completions.create(model="m", messages=USER, max_tokens=4, n=3, logprobs=True, top_logprobs=2,
                                         temperature=1.0, seed=5, extra_body={"thinking": {"type": "disabled"}})
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    for choice in out.choices:
        entries = choice.logprobs.content
        assert len(entries) == 4 and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
    assert out.usage.completion_tokens == 12


def test_completions_text_and_token_ids(client, tiny_model):
    text = client.completions.create(model="m", prompt="Once upon a time", max_tokens=4, temperature=0)
    assert text.choices[0].finish_reason == "length" and text.usage.completion_tokens == 4
    ids = [0, 1000, 2000, 3000, 4000, 5000]
    out = client.completions.create(model="m", prompt=ids, max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True}, logprobs=2)
    with torch.inference_mode():
        assert out.choices[0].model_extra["token_ids"] == greedy(tiny_model, torch.tensor(ids), 6)
    assert len(out.choices[0].logprobs.token_logprobs) == 6


def test_echo_scores_the_prompt_as_the_model_does(serve, client, tiny_model, tiny_checkpoint):
    """echo with logprobs (what evaluation harnesses send to score a text): the prompt's text and
    tokens come first, its first token unscored, the others at the model's own logprobs; the
    same streamed. A conversation's next turn, whose start a worker holds, is computed whole
    when scored (nothing cached) and reused again when not."""
    tokenizer = load_tokenizer(tiny_checkpoint)
    recomputed = serve.log_path.read_text().count("recomputing here")
    conversation = {"X-Conversation-Id": "echo-turns"}
    first = client.completions.create(model="m", prompt=[0, 1000, 2000, 3000], max_tokens=3, temperature=0,
                                      extra_headers=conversation, extra_body={"return_token_ids": True})
    ids = [0, 1000, 2000, 3000] + first.choices[0].model_extra["token_ids"] + [4000, 5000]
    prompt_text = tokenizer.decode(ids)
    with torch.inference_mode():
        logp = torch.log_softmax(prompt_logits(tiny_model, torch.tensor(ids)), -1)
    want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
    out = client.completions.create(model="m", prompt=ids, max_tokens=2, temperature=0, echo=True, logprobs=1,
                                    extra_headers=conversation, extra_body={"return_token_ids": True})
    assert out.usage.prompt_tokens_details.cached_tokens == 0  # scored: computed whole
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(prompt_text) and len(lp.tokens) == len(ids) + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:len(ids)], want)) < 1e-3
    assert all(len(top) == 1 for top in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[len(ids)] == len(prompt_text)
    assert choice.model_extra["token_ids"] == greedy(tiny_model, torch.tensor(ids), 2)
    later = ids + choice.model_extra["token_ids"] + [6000]
    third = client.completions.create(model="m", prompt=later, max_tokens=2, temperature=0, echo=True,
                                      extra_headers=conversation)
    assert third.usage.prompt_tokens_details.cached_tokens > len(ids)  # unscored: the scored turn's cache reused
    assert third.choices[0].text.startswith(tokenizer.decode(later)) and third.choices[0].logprobs is None
    stream = client.completions.create(model="m", prompt=ids, max_tokens=2, temperature=0, echo=True, logprobs=1,
                                       stream=True)
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == choice.text
    streamed = [v for c in chunks for v in c.logprobs.token_logprobs]
    offsets = [v for c in chunks for v in c.logprobs.text_offset]
    assert streamed[0] is None and streamed[1:] == lp.token_logprobs[1:] and offsets == lp.text_offset
    text = client.completions.create(model="m", prompt="Once upon a time", max_tokens=3, temperature=0, echo=True)
    assert text.choices[0].text.startswith("Once upon a time")
    assert serve.log_path.read_text().count("recomputing here") == recomputed  # the prefill worker scored them


def test_max_tokens_0_with_echo_scores_the_prompt_alone(client, tiny_model, tiny_checkpoint):
    """max_tokens 0 with echo and logprobs (older evaluation harnesses): the prompt alone, scored,
    no completion tokens, whole or streamed."""
    ids = [0, 1000, 2000, 3000, 4000]
    prompt_text = load_tokenizer(tiny_checkpoint).decode(ids)
    with torch.inference_mode():
        logp = torch.log_softmax(prompt_logits(tiny_model, torch.tensor(ids)), -1)
    want = logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
    out = client.completions.create(model="m", prompt=ids, max_tokens=0, echo=True, logprobs=1)
    choice = out.choices[0]
    assert choice.text == prompt_text and choice.finish_reason == "length" and out.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.token_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(choice.logprobs.token_logprobs[1:], want)) < 1e-3
    chunks = [c.choices[0] for c in client.completions.create(model="m", prompt=ids, max_tokens=0, echo=True,
                                                                logprobs=1, stream=True) if c.choices]
    assert "".join(c.text for c in chunks) == prompt_text
    assert [v for c in chunks for v in c.logprobs.token_logprobs] == choice.logprobs.token_logprobs


def test_vllms_prompt_logprobs(client, tiny_model):
    """prompt_logprobs (vLLM's extension): None for the first token, then the prompt token's
    logprob and rank first, and the n most likely with theirs; a chat's at the reply's top level;
    refused when streamed."""
    ids = [0, 1000, 2000, 3000, 4000]
    with torch.inference_mode():
        logp = torch.log_softmax(prompt_logits(tiny_model, torch.tensor(ids)), -1)
    out = client.completions.create(model="m", prompt=ids, max_tokens=1, temperature=0, logprobs=0, echo=True,
                                    extra_body={"prompt_logprobs": 2})
    got = out.choices[0].model_extra["prompt_logprobs"]
    assert got[0] is None and len(got) == len(ids)
    for row, token, entry in zip(logp, ids[1:], got[1:]):
        assert list(entry)[0] == str(token) and 2 <= len(entry) <= 3
        assert abs(entry[str(token)]["logprob"] - row[token]) < 1e-3
        assert entry[str(token)]["rank"] == int((row > row[token]).sum()) + 1
        for rank, best in enumerate(torch.topk(row, 2).indices.tolist(), 1):
            assert entry[str(best)]["rank"] == rank and entry[str(best)]["decoded_token"] is not None
    assert all(top == {} for top in out.choices[0].logprobs.top_logprobs[1:])  # echo's own count: logprobs=0
    chat = client.chat.completions.create(model="m", messages=USER, max_tokens=1,
                                          extra_body={"prompt_logprobs": 0, "thinking": {"type": "disabled"}})
    whole = chat.model_extra["prompt_logprobs"]
    assert whole[0] is None and len(whole) == chat.usage.prompt_tokens and all(len(e) == 1 for e in whole[1:])
    with pytest.raises(openai.BadRequestError, match="not streamed"):
        client.completions.create(model="m", prompt=ids, max_tokens=1, stream=True, extra_body={"prompt_logprobs": 1})


def test_logit_bias_reaches_the_sampler(client, tiny_model):
    """OpenAI's logit_bias: +100 on one token makes every token it; -100 on greedy's first token
    makes the first token another."""
    ids = [0, 1000, 2000, 3000]
    forced = client.completions.create(model="m", prompt=ids, max_tokens=4, temperature=0, logit_bias={"4321": 100},
                                       extra_body={"return_token_ids": True})
    assert forced.choices[0].model_extra["token_ids"] == [4321] * 4
    first = greedy(tiny_model, torch.tensor(ids), 1)[0]
    banned = client.completions.create(model="m", prompt=ids, max_tokens=1, temperature=0,
                                       logit_bias={str(first): -100}, extra_body={"return_token_ids": True})
    assert banned.choices[0].model_extra["token_ids"] != [first]


def test_a_batch_of_prompts_equals_each_alone(client, tiny_model):
    """OpenAI numbers a batch's choices prompt by prompt, n each; every one is its prompt's greedy
    output, streamed or not, and the usage adds the prompts up."""
    prompts = [[0, 1000, 2000, 3000], [0, 77, 88], [5, 6, 7, 8, 9]]
    with torch.inference_mode():
        alone = [greedy(tiny_model, torch.tensor(p), 5) for p in prompts]
    out = client.completions.create(model="m", prompt=prompts, n=2, max_tokens=5, temperature=0,
                                    extra_body={"return_token_ids": True})
    assert [c.index for c in out.choices] == list(range(6))
    assert [c.model_extra["token_ids"] for c in out.choices] == [ids for ids in alone for _ in range(2)]
    assert out.usage.prompt_tokens == 12 and out.usage.completion_tokens == 30
    stream = client.completions.create(model="m", prompt=prompts, max_tokens=5, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    texts, usage = {}, None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
        usage = chunk.usage or usage
    singles = [client.completions.create(model="m", prompt=p, max_tokens=5, temperature=0).choices[0].text
               for p in prompts]
    assert [texts[i] for i in range(3)] == singles and usage.prompt_tokens == 12


def test_stop_string_spanning_tokens(client):
    plain = client.completions.create(model="m", prompt=[0, 11, 22, 33], max_tokens=12, temperature=0)
    text = plain.choices[0].text
    stop = text[len(text) // 3: len(text) // 3 + 3]
    cut = client.completions.create(model="m", prompt=[0, 11, 22, 33], max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


def test_client_disconnect_cancels_both_tiers(serve):
    body = {"model": "m", "messages": USER, "max_tokens": 5000, "stream": True, "ignore_eos": True,
            "thinking": {"type": "disabled"}}
    with httpx.stream("POST", f"{serve.url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                break  # decoding runs; hang up
    for _ in range(100):
        status = serve.decode_status()
        if status.running_requests == 0 and status.waiting_requests == 0:
            break
        time.sleep(0.1)
    assert status.running_requests == 0 and status.waiting_requests == 0


def test_golden_greedy_through_the_whole_stack(golden_dir, golden, tmp_path):
    process = ServeProcess(golden_dir, tmp_path / "serve.log")
    try:
        client = openai.OpenAI(base_url=f"{process.url}/v1", api_key="unused", max_retries=0)
        for prompt in golden:
            out = client.completions.create(model="m", prompt=prompt["input_ids"].tolist(), temperature=0,
                                            max_tokens=16, extra_body={"return_token_ids": True, "ignore_eos": True})
            assert out.choices[0].model_extra["token_ids"] == prompt["greedy_ids"].tolist()
    finally:
        process.close()


def test_sampled_reply_quoted_back_reuses_the_cached_turn(client, tiny_checkpoint):
    """A sampled reply often re-tokenizes to other ids than the model generated. Quoted back
    in the next turn it must still match the cached turn (the gateway splices the generated
    ids), or the whole conversation is recomputed."""
    from dsflash.gateway import special_tokens as st
    from dsflash.gateway.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_checkpoint)
    options = dict(model="m", max_tokens=8, temperature=1.0, logprobs=True,
                   extra_body={"thinking": {"type": "disabled"}})
    for seed in range(20):  # a reply of plain text whose ids differ from its re-tokenization
        conversation = {"X-Conversation-Id": f"respelled-{seed}"}
        first = client.chat.completions.create(messages=USER, seed=seed, extra_headers=conversation, **options)
        content = first.choices[0].message.content or ""
        spelled = [t.token for t in first.choices[0].logprobs.content]
        if (content and not any(t in st.BY_TEXT for t in spelled)
                and len(tokenizer.encode_texts([content])[0]) != first.usage.completion_tokens):
            break
    else:
        pytest.fail("no seed gave a plain reply that re-tokenizes differently")
    history = USER + [{"role": "assistant", "content": content}, {"role": "user", "content": "More."}]
    second = client.chat.completions.create(messages=history, seed=seed, extra_headers=conversation, **options)
    held = first.usage.prompt_tokens + first.usage.completion_tokens
    assert held - 1 <= second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


def test_thinking_conversation_reuses_the_turn_before_its_reply(client):
    """Thinking mode drops earlier reasoning from the history, so turn two quotes turn one's
    reply differently from how it was generated; it still reuses turn one's prompt."""
    conversation = {"X-Conversation-Id": "thinking-turns"}
    first = client.chat.completions.create(model="m", messages=USER, max_tokens=6, extra_headers=conversation)
    reply = first.choices[0].message
    history = USER + [{"role": "assistant", "content": reply.content or "",
                       "reasoning_content": reply.model_extra.get("reasoning_content")},
                      {"role": "user", "content": "And another."}]
    second = client.chat.completions.create(model="m", messages=history, max_tokens=6, extra_headers=conversation)
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1


def test_responses_api_answers_as_chat_and_continues_from_the_cache(client):
    """/v1/responses through the whole stack: greedy, its text is the chat completion's for the
    same messages; turn two (previous_response_id) reuses turn one's cache on the decode worker."""
    off = {"thinking": {"type": "disabled"}}
    chat = client.chat.completions.create(model="m", messages=USER, max_tokens=6, temperature=0.0, extra_body=off)
    first = client.responses.create(model="m", input=USER, max_output_tokens=6, temperature=0.0, extra_body=off)
    assert first.output_text == chat.choices[0].message.content and first.status == "incomplete"
    assert first.usage.input_tokens == chat.usage.prompt_tokens and first.usage.output_tokens == 6
    second = client.responses.create(model="m", input="And another.", previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0.0, extra_body=off)
    held = first.usage.input_tokens + first.usage.output_tokens
    assert held - 1 <= second.usage.input_tokens_details.cached_tokens < second.usage.input_tokens
    streamed = list(client.responses.create(model="m", input=USER, max_output_tokens=6, temperature=0.0,
                                            stream=True, extra_body=off))
    assert streamed[-1].type == "response.incomplete" and streamed[-1].response.output_text == first.output_text


def test_messages_api_answers_as_chat(serve):
    """/v1/messages through the whole stack, Anthropic's client: greedy, its text is the chat
    completion's for the same messages (thinking off in both: the Messages API's default)."""
    import anthropic

    chat = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="m", messages=USER, max_tokens=6, temperature=0.0, extra_body={"thinking": {"type": "disabled"}})
    claude = anthropic.Anthropic(base_url=serve.url, api_key="unused", max_retries=0)
    reply = claude.messages.create(model="m", messages=USER, max_tokens=6, extra_body={"temperature": 0.0})
    assert reply.content[0].text == chat.choices[0].message.content and reply.stop_reason == "max_tokens"
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == chat.usage.prompt_tokens
