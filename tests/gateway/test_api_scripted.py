"""Gateway behaviour a random model cannot show, against a scripted decode worker: tool calls,
SSE framing, worker failures as errors (never a 200 with empty content)."""

from __future__ import annotations

import concurrent.futures
import json
import time

import grpc
import httpx
import openai
import pytest

from dsflash.gateway import special_tokens as st
from dsflash.gateway.dsml import render_calls
from dsflash.gateway.endpoints import GatewaySettings
from dsflash.gateway.segments import SegmentBuilder, spell
from dsflash.gateway.tokenizer import load_tokenizer
from tests.support.gateway_harness import ScriptedGateway

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def _ids(tok, segments):
    from dsflash.gateway.chat_encoding import encode_segments

    return encode_segments(tok, segments)


def _chunks(ids, size=3):
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def test_forced_tool_call_streams_as_tool_call_deltas(tok):
    call = SegmentBuilder()
    render_calls(call, [("get_weather", {"city": "Paris", "days": 3})])
    full = spell(call.build())
    opening = full[: full.index('">\n') + 3]  # what the gateway forces into the prompt
    rest = _ids(tok, [full[len(opening):]]) + [st.EOS.id]

    def script(request):
        # the prompt must end with the forced opening of the named function
        assert tok.decode(list(request.token_ids[-12:])).endswith('invoke name="get_weather">\n')
        return _chunks(rest), "stop"

    gw = ScriptedGateway(script)
    try:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
        choice = {"type": "function", "function": {"name": "get_weather"}}
        out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
                                             tool_choice=choice)
        msg = out.choices[0]
        assert msg.finish_reason == "tool_calls"
        assert msg.message.tool_calls[0].function.name == "get_weather"
        assert json.loads(msg.message.tool_calls[0].function.arguments) == {"city": "Paris", "days": 3}
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "weather?"}],
                                                tools=TOOLS, tool_choice=choice, stream=True)
        pieces = [c.choices[0].delta.tool_calls for c in stream if c.choices and c.choices[0].delta.tool_calls]
        first = pieces[0][0]
        assert first.id and first.function.name == "get_weather"
        args = "".join(p[0].function.arguments or "" for p in pieces)
        assert json.loads(args) == {"city": "Paris", "days": 3}
    finally:
        gw.close()


def test_sse_framing_keepalive_and_done(tok):
    text = _ids(tok, ["Hello world, this is streamed."])
    gw = ScriptedGateway(lambda r: (_chunks(text, 2), "stop"), delay_s=0.3)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "thinking": {"type": "disabled"}}
        with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            raw = r.read().decode()
        events = [e for e in raw.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert any(e == ": keep-alive" for e in events)  # keepalive_s is 0.2 in the harness
        data = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
        assert "".join(d["choices"][0]["delta"].get("content", "") for d in data) == "Hello world, this is streamed."
        assert data[-1]["choices"][0]["finish_reason"] == "stop"
    finally:
        gw.close()


def test_worker_failure_mid_stream_is_an_sse_error_event(tok):
    ids = _ids(tok, ["partial answer"])
    gw = ScriptedGateway(lambda r: ([ids, grpc.StatusCode.UNAVAILABLE], "stop"))
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        raw = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30).text
        events = [e for e in raw.split("\n\n") if e.startswith("data: ")]
        assert json.loads(events[-2][6:])["error"]["type"] == "service_unavailable"
        assert events[-1] == "data: [DONE]"
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={**body, "stream": False}, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
    finally:
        gw.close()


def test_rejected_by_worker_is_a_4xx(tok):
    gw = ScriptedGateway(lambda r: (grpc.StatusCode.INVALID_ARGUMENT, "prompt too long for this worker"))
    try:
        r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": [1, 2, 3]}, timeout=30)
        assert r.status_code == 400 and "too long" in r.json()["error"]["message"]
    finally:
        gw.close()


def test_client_disconnect_cancels_the_worker_stream(tok):
    ids = _ids(tok, ["word " * 200])
    gw = ScriptedGateway(lambda r: (_chunks(ids, 1), "length"), delay_s=0.05)
    try:
        body = {"model": "m", "prompt": [5, 6], "stream": True}
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if '"text":"' in line:
                    break
        deadline = time.monotonic() + 5
        while not gw.backend.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gw.backend.cancelled  # the gRPC stream was cancelled: the decode worker aborts
    finally:
        gw.close()


def test_api_keys(tok):
    ids = _ids(tok, ["ok"])
    gw = ScriptedGateway(lambda r: ([ids], "stop"), settings=GatewaySettings(api_keys=("k1", "k2")))
    try:
        body = {"prompt": [1, 2]}
        assert httpx.post(f"{gw.url}/v1/completions", json=body).status_code == 401
        bad = httpx.post(f"{gw.url}/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        good = httpx.post(f"{gw.url}/v1/completions", json=body, headers={"Authorization": "Bearer k2"})
        assert good.status_code == 200 and good.json()["choices"][0]["text"] == "ok"
        assert httpx.get(f"{gw.url}/healthz").status_code == 200  # probes need no key
        odd = httpx.post(f"{gw.url}/v1/completions", json=body, headers={"Authorization": b"Bearer k\xe9"})
        assert odd.status_code == 401  # (a non-ASCII token: compare_digest refuses non-ASCII text)
    finally:
        gw.close()


def test_bodies_that_are_not_utf8_json_text_are_400s(tok):
    """A body in UTF-16, one nested past the parser's recursion, one with an unpaired surrogate
    escape: a 400 each, before any field is read (a 500 where one reached a gRPC message)."""
    gw = ScriptedGateway(lambda r: ([[st.EOS.id]], "stop"))
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        for raw in (json.dumps({**chat, "user": "\ud800"}).encode("utf-16-le"),
                    json.dumps({**chat, "user": "\ud800"}).encode(),
                    b'{"messages": [], "metadata": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
            r = httpx.post(f"{gw.url}/v1/chat/completions", content=raw, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert not gw.backend.requests
    finally:
        gw.close()


def test_min_tokens_reaches_the_worker_and_holds_off_stop_strings(tok):
    head, tail = _ids(tok, ["a, b"]), _ids(tok, [", c, d"])
    seen = []

    def script(request):
        seen.append(request.sampling.min_tokens)
        return _chunks(head + tail, 2), "length"

    gw = ScriptedGateway(script)
    try:
        body = {"prompt": [1, 2], "max_tokens": 16, "stop": [","], "min_tokens": len(head)}
        r = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30)
        choice = r.json()["choices"][0]
        assert r.status_code == 200 and choice["text"] == "a, b" and choice["finish_reason"] == "stop"
        assert seen == [len(head)]
    finally:
        gw.close()


def test_the_clients_request_id_comes_back_and_reaches_the_worker(tok):
    ids = _ids(tok, ["ok"])
    seen = []

    def script(request):
        seen.append(request.request_id)
        return [ids], "stop"

    gw = ScriptedGateway(script)
    try:
        body = {"prompt": [1, 2]}
        for stream in (False, True):
            r = httpx.post(f"{gw.url}/v1/completions", json={**body, "stream": stream},
                           headers={"X-Request-Id": "proxy-7f3a"}, timeout=30)
            assert r.status_code == 200 and r.headers["x-request-id"] == "proxy-7f3a"
        refused = httpx.post(f"{gw.url}/v1/completions", json={"prompt": []}, headers={"X-Request-Id": "p-1"})
        assert refused.status_code == 400 and refused.headers["x-request-id"] == "p-1"  # on errors too
        plain = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30)
        odd = httpx.post(f"{gw.url}/v1/completions", json=body, headers={"X-Request-Id": "a b;c"}, timeout=30)
        assert plain.headers["x-request-id"] == plain.json()["id"] == seen[2].rsplit("-", 1)[0]
        assert odd.headers["x-request-id"] == odd.json()["id"] and "a b" not in seen[3]  # not a plain id: ours
        assert all(s.startswith("cmpl-proxy-7f3a-") for s in seen[:2]) and seen[0] != seen[1]  # unique per request
    finally:
        gw.close()


def test_a_batchs_seeds_and_conversations(tok):
    """Each prompt's j-th choice draws from seed + j wherever the prompt stands (wrapped into
    int64), and a conversation two prompts matched is continued by the first one alone."""
    from dsflash.gateway.router import Route
    from dsflash.kvcache.directory import WorkerRole

    ids = _ids(tok, ["ok"])
    seen = {}

    def script(request):
        seen[request.request_id.rsplit("-", 1)[1]] = (request.sampling.seed, request.conversation_id)
        return [ids], "stop"

    gw = ScriptedGateway(script)

    async def one_conversation(_conversation, _tokens):
        workers = await gw.ctx.router.workers(WorkerRole.DECODE)
        return Route(workers[0].address, "", "shared", "prefix")

    gw.ctx.router.route = one_conversation
    try:
        body = {"prompt": [[1, 2], [3, 4]], "n": 2, "seed": 2**63 - 1}
        r = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
        assert seen == {"0": (2**63 - 1, "shared"), "1": (-2**63, ""), "2": (2**63 - 1, ""), "3": (-2**63, "")}
    finally:
        gw.close()


def test_health_generate_is_a_canary_through_a_worker(tok):
    """GET /health_generate: one greedy token of a one-token prompt (no conversation kept), and
    probes that arrive together share it; a worker's error, a prompt the decode worker had to
    compute itself, or a generation past the bound is a 503, and the canary is cancelled."""
    gw = ScriptedGateway(lambda r: ([[5]], "length"), delay_s=0.5)
    try:
        ok = httpx.get(f"{gw.url}/health_generate", timeout=30)
        assert ok.status_code == 200 and ok.json()["status"] == "ok" and ok.json()["decode_worker"]
        assert ok.json()["prefill_worker"] == "127.0.0.1:1"  # the harness's static prefill address
        canary = gw.backend.requests[-1]
        assert list(canary.token_ids) == [st.BOS.id] and canary.sampling.max_tokens == 1
        assert canary.sampling.temperature == 0 and not canary.conversation_id
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            probes = list(pool.map(lambda _: httpx.get(f"{gw.url}/health_generate", timeout=30), range(4)))
        assert [p.status_code for p in probes] == [200] * 4 and len(gw.backend.requests) == 2  # one canary for all
        gw.backend.recomputes = True
        alone = httpx.get(f"{gw.url}/health_generate", timeout=30)
        assert alone.status_code == 503 and "computed the prompt itself" in alone.json()["error"]["message"]
    finally:
        gw.close()
    gw = ScriptedGateway(lambda r: (grpc.StatusCode.UNAVAILABLE, "engine wedged"))
    try:
        down = httpx.get(f"{gw.url}/health_generate", timeout=30)
        assert down.status_code == 503 and "engine wedged" in down.json()["error"]["message"]
    finally:
        gw.close()
    gw = ScriptedGateway(lambda r: ([[5]], "length"), delay_s=20.0,
                         settings=GatewaySettings(keepalive_s=0.2, health_generate_timeout_s=0.5))
    try:
        slow = httpx.get(f"{gw.url}/health_generate", timeout=30)
        assert slow.status_code == 503 and "timed out" in slow.json()["error"]["message"]
        for _ in range(100):
            if gw.backend.cancelled:
                break
            time.sleep(0.05)
        assert gw.backend.cancelled == [gw.backend.requests[-1].request_id]  # no worker decodes for nobody
    finally:
        gw.close()


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "both"])
def test_the_reasoning_field_is_named_as_configured(tok, field):
    """--reasoning-field: DeepSeek's reasoning_content, vLLM's reasoning, or both, in the reply
    and in every streamed delta that carries reasoning."""
    ids = _ids(tok, ["Let me think."]) + [st.THINK_END.id] + _ids(tok, ["Done."]) + [st.EOS.id]
    gw = ScriptedGateway(lambda r: (_chunks(ids, 2), "stop"),
                         settings=GatewaySettings(keepalive_s=0.2, reasoning_field=field))
    names = {"reasoning_content": {"reasoning_content"}, "reasoning": {"reasoning"},
             "both": {"reasoning_content", "reasoning"}}[field]
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        message = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
        assert message["content"] == "Done." and {k for k in message if k.startswith("reasoning")} == names
        assert all(message[k] == "Let me think." for k in names)
        with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
            data = [json.loads(e[6:]) for e in r.read().decode().split("\n\n") if e.startswith("data: {")]
        deltas = [delta for delta in (d["choices"][0]["delta"] for d in data)
                  if any(k.startswith("reasoning") for k in delta)]
        assert deltas and all({k for k in d if k.startswith("reasoning")} == names for d in deltas)
        for name in names:
            assert "".join(d[name] for d in deltas) == "Let me think."
    finally:
        gw.close()


def test_echo_stream_and_whole_reply_agree_across_split_characters_and_a_stop(tok):
    """Echo with logprobs: a token's text_offset counts the characters decoded before it (one
    split over tokens counts where it completes), so offsets never go back; the stream's tokens,
    scores and offsets equal the whole reply's, the chunk that a stop string ends included."""
    prompt = "😀😀😀😀😀 a"
    generated = _ids(tok, [" 世界 ok. more"])
    gw = ScriptedGateway(lambda r: ([[t] for t in generated], "length"))
    try:
        body = {"model": "m", "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 16, "stop": ["."]}
        whole = httpx.post(f"{gw.url}/v1/completions", json=body, timeout=30).json()["choices"][0]
        with httpx.stream("POST", f"{gw.url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
            data = [json.loads(e[6:]) for e in r.read().decode().split("\n\n") if e.startswith("data: {")]
        chunks = [d["choices"][0] for d in data]
        assert whole["text"] == prompt + " 世界 ok" == "".join(c["text"] for c in chunks)
        lp = whole["logprobs"]
        n = len(tok.encode_text(prompt))
        assert lp["token_logprobs"][:2] == [None, -1.0] and lp["token_logprobs"][n:] == [-0.5] * (len(lp["tokens"]) - n)
        assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][n] == len(prompt)
        assert lp["tokens"][-1] == "." and whole["finish_reason"] == "stop"  # the stop's token keeps its score
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [v for c in chunks for v in c["logprobs"][key]] == lp[key], key
    finally:
        gw.close()


def test_tokenize_gives_the_prompt_a_completion_would_send(tok):
    """vLLM's /tokenize: a text's ids, or a chat's as its chat completion sends them (a forced
    tool call's opening included), `count` its prompt_tokens; /detokenize inverts; both ask
    for the API key where one is set."""
    gw = ScriptedGateway(lambda r: ([_ids(tok, ["ok"])], "stop"), settings=GatewaySettings(api_keys=("k",)))
    auth = {"Authorization": "Bearer k"}
    try:
        assert httpx.post(f"{gw.url}/tokenize", json={"prompt": "x"}, timeout=30).status_code == 401
        text = httpx.post(f"{gw.url}/tokenize", json={"prompt": "Hello there", "return_token_strs": True},
                          headers=auth, timeout=30).json()
        assert text["tokens"] == tok.encode_text("Hello there") and text["count"] == len(text["tokens"])
        assert "".join(text["token_strs"]) == "Hello there" and text["max_model_len"] == 1_048_576
        for extra in ({}, {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}):
            body = {"messages": [{"role": "user", "content": "weather?"}], **extra}
            chat = httpx.post(f"{gw.url}/tokenize", json=body, headers=auth, timeout=30).json()
            reply = httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=auth, timeout=30).json()
            assert chat["tokens"] == list(gw.backend.requests[-1].token_ids)
            assert chat["count"] == reply["usage"]["prompt_tokens"] and chat["token_strs"] is None
        back = httpx.post(f"{gw.url}/detokenize", json={"tokens": text["tokens"]}, headers=auth, timeout=30).json()
        assert back == {"prompt": "Hello there"}
        long = httpx.post(f"{gw.url}/detokenize", json={"tokens": [5] * 1_048_577}, headers=auth, timeout=30)
        assert long.status_code == 400 and long.json()["error"]["param"] == "tokens"  # past the model's context
    finally:
        gw.close()


def test_parallel_tool_calls_off_answers_with_the_first_call(tok):
    """parallel_tool_calls: false: two generated calls reach the client as one, whole or streamed,
    and the second call's start ends the worker's stream; where max_tokens cut that call, the
    reply still ends in tool_calls."""
    calls = SegmentBuilder()
    render_calls(calls, [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})])
    ids = _ids(tok, [spell(calls.build())]) + [st.EOS.id]
    gw = ScriptedGateway(lambda r: (_chunks(ids), "stop"), delay_s=0.02)
    try:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
        options = dict(model="m", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
                       extra_body={"thinking": {"type": "disabled"}})

        def cities(reply):
            return [json.loads(c.function.arguments)["city"] for c in reply.choices[0].message.tool_calls]

        assert cities(client.chat.completions.create(**options)) == ["Paris", "Rome"]
        one = client.chat.completions.create(parallel_tool_calls=False, **options)
        assert cities(one) == ["Paris"] and one.choices[0].finish_reason == "tool_calls"
        assert one.usage.completion_tokens < len(ids)  # the second call's start ended the stream
        for _ in range(100):
            if gw.backend.cancelled:
                break
            time.sleep(0.05)
        assert gw.backend.cancelled == [gw.backend.requests[-1].request_id]  # no worker decodes for nobody
        stream = client.chat.completions.create(parallel_tool_calls=False, stream=True, **options)
        pieces = [p for c in stream if c.choices for p in c.choices[0].delta.tool_calls or []]
        assert {p.index for p in pieces} == {0} and "Rome" not in "".join(p.function.arguments or "" for p in pieces)
    finally:
        gw.close()
    # max_tokens ran out inside the dropped second call: the kept first one is whole
    cut = _ids(tok, [spell(calls.build())[:-40]])
    gw = ScriptedGateway(lambda r: (_chunks(cut), "length"))
    try:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
        one = client.chat.completions.create(parallel_tool_calls=False, **options)
        assert cities(one) == ["Paris"] and one.choices[0].finish_reason == "tool_calls"
        assert client.chat.completions.create(**options).choices[0].finish_reason == "length"
    finally:
        gw.close()


def test_vllm_and_sglang_thinking_switches_in_chat_template_kwargs(tok):
    """Clients written for vLLM or SGLang switch thinking with chat_template_kwargs: each form
    renders the prompt of DeepSeek's own `thinking` field; that field wins where both are sent."""
    gw = ScriptedGateway(lambda r: ([_ids(tok, ["ok"]), [st.EOS.id]], "stop"))
    try:
        def prompt(**extra) -> list[int]:
            body = {"messages": [{"role": "user", "content": "hi"}], **extra}
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 200, r.json()
            return list(gw.backend.requests[-1].token_ids)

        on, off = prompt(thinking={"type": "enabled"}), prompt(thinking={"type": "disabled"})
        assert on != off and prompt() == on
        for switch in ({"thinking": False}, {"enable_thinking": False}, {"thinking_mode": "chat"}):
            assert prompt(chat_template_kwargs=switch) == off, switch
        assert prompt(chat_template_kwargs={"thinking": True}) == on
        assert prompt(chat_template_kwargs={"thinking": False}, thinking={"type": "enabled"}) == on
        assert prompt(chat_template_kwargs={"reasoning_effort": "max"}) == prompt(reasoning_effort="max") != on
        bad = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"thinking": "no"}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"
    finally:
        gw.close()


def test_continuous_usage_stats_count_the_tokens_framed_so_far(tok):
    """vLLM's stream_options.continuous_usage_stats: every chunk's usage, its completion tokens
    those of the chunks sent so far, ending where the closing usage chunk does (n choices too)."""
    ids = _ids(tok, ["one two three four five six"]) + [st.EOS.id]
    gw = ScriptedGateway(lambda r: (_chunks(ids, 2), "stop"))
    try:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2,
                                                      "thinking": {"type": "disabled"}}),
                           ("/v1/completions", {"prompt": [1, 2, 3]})):
            body = {**body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            raw = httpx.post(f"{gw.url}{path}", json=body, timeout=30).text
            chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
            counts = [c["usage"]["completion_tokens"] for c in chunks]
            assert all(c["usage"]["prompt_tokens"] == chunks[-1]["usage"]["prompt_tokens"] for c in chunks)
            assert counts == sorted(counts) and counts[-2] == counts[-1] == len(ids) * body.get("n", 1), counts
    finally:
        gw.close()


def test_a_stream_the_workers_refuse_at_once_gets_its_real_status(tok):
    """The headers wait for the first update: a refusal before any token is a 429 (or 503, 400)
    that clients retry on or show, on every streamed endpoint and in each API's shape, not a
    200 and an error event; nothing stays running."""
    gw = ScriptedGateway(lambda r: (grpc.StatusCode.RESOURCE_EXHAUSTED, "the decode worker is full"))
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"prompt": [1, 2]}),
                           ("/v1/responses", {"input": "hi"}), ("/v1/messages", {**chat, "max_tokens": 5})):
            r = httpx.post(f"{gw.url}{path}", json={**body, "stream": True}, timeout=30)
            assert r.status_code == 429, (path, r.text)
            error = r.json()["error"]
            assert error["type"] == "rate_limit_error" and "full" in error["message"]
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0).chat.completions.create(
                model="m", stream=True, **chat)
        # a forced tool call's opening goes out before any token: it does not start the stream
        forced = {**chat, "tools": TOOLS, "tool_choice": "required", "stream": True}
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=forced, timeout=30).status_code == 429
    finally:
        gw.close()
    # a worker that ends the stream as CANCELLED (shutting down): a 503, not a client left waiting
    gw = ScriptedGateway(lambda r: (grpc.StatusCode.CANCELLED, "the worker is draining"))
    try:
        for stream in (True, False):
            r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": [1, 2], "stream": stream}, timeout=30)
            assert r.status_code == 503 and "draining" in r.json()["error"]["message"]
    finally:
        gw.close()


def test_a_client_leaving_before_the_first_token_stops_the_worker(tok):
    """The headers wait for the first update: a client gone meanwhile (a long prefill) is
    noticed there, and the worker's stream cancelled, not when the stream would have begun."""
    ids = _ids(tok, ["late"])
    settings = GatewaySettings(keepalive_s=30.0)
    gw = ScriptedGateway(lambda r: ([[], ids], "stop"), delay_s=20.0, settings=settings)  # (first token at 20 s)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{gw.url}/v1/completions", json={"prompt": [1, 2], "stream": True}, timeout=0.5)
        for _ in range(60):
            if gw.backend.cancelled:
                break
            time.sleep(0.1)
        assert gw.backend.cancelled
    finally:
        gw.close()
