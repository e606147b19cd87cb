"""Bad input gets an OpenAI error object with a 4xx, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from dsflash.gateway.endpoints import GatewaySettings
from dsflash.gateway.tokenizer import load_tokenizer
from tests.support.gateway_harness import ScriptedGateway

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]

CASES = [
    ("malformed JSON", CHAT, b'{"messages": [', 400, None),
    ("not an object", CHAT, b"[1, 2]", 400, None),
    ("missing messages", CHAT, {"model": "m"}, 400, "messages"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("messages wrong type", CHAT, {"messages": "hi"}, 400, "messages"),
    ("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("image part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, None),
    ("temperature type", CHAT, {"messages": MSG, "temperature": "hot"}, 400, "temperature"),
    ("temperature range", CHAT, {"messages": MSG, "temperature": 5}, 400, "temperature"),
    ("top_p range", CHAT, {"messages": MSG, "top_p": 0}, 400, "top_p"),
    ("n range", CHAT, {"messages": MSG, "n": 0}, 400, "n"),
    ("max_tokens range", CHAT, {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    ("min_tokens range", CHAT, {"messages": MSG, "min_tokens": -1}, 400, "min_tokens"),
    ("min_tokens over max_tokens", CHAT, {"messages": MSG, "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ("min_tokens over the default budget", TEXT, {"prompt": "x", "min_tokens": 1_048_000}, 400, "min_tokens"),
    ("top_logprobs without logprobs", CHAT, {"messages": MSG, "top_logprobs": 3}, 400, None),
    ("top_logprobs range", CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 99}, 400, "top_logprobs"),
    ("too many stops", CHAT, {"messages": MSG, "stop": ["a"] * 17}, 400, "stop"),
    ("bad thinking", CHAT, {"messages": MSG, "thinking": {"type": "sometimes"}}, 400, "thinking.type"),
    ("bad effort", CHAT, {"messages": MSG, "reasoning_effort": "extreme"}, 400, None),
    ("tool_choice unknown function", CHAT, {"messages": MSG, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, None),
    ("context too long", CHAT, {"messages": MSG, "max_tokens": 1_048_576}, 400, "max_tokens"),
    ("prompt too long", TEXT, {"prompt": [5] * 1_048_500, "max_tokens": 100}, 400, "max_tokens"),
    ("out-of-vocab token id", TEXT, {"prompt": [1, 2, 10_000_000]}, 400, "prompt"),
    ("negative token id", TEXT, {"prompt": [1, -2]}, 400, "prompt"),
    ("empty prompt", TEXT, {"prompt": []}, 400, "prompt"),
    ("empty text prompt", TEXT, {"prompt": ["a", ""]}, 400, "prompt"),
    ("too many choices", TEXT, {"prompt": ["a"] * 5, "n": 16}, 400, "prompt"),
    ("a batch's prompt too long", TEXT, {"prompt": [[5], [5] * 1_048_500], "max_tokens": 100}, 400, "max_tokens"),
    ("prompt wrong type", TEXT, {"prompt": {"a": 1}}, 400, "prompt"),
    ("suffix unsupported", TEXT, {"prompt": "x", "suffix": "y"}, 400, None),
    ("best_of unsupported", TEXT, {"prompt": "x", "best_of": 3}, 400, "best_of"),
    ("max_tokens 0 without echo", TEXT, {"prompt": "x", "max_tokens": 0}, 400, None),
    ("chat max_tokens 0", CHAT, {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    ("echo logprobs out of range", TEXT, {"prompt": "x", "echo": True, "logprobs": 21}, 400, "logprobs"),
    ("echo scores past a message", TEXT, {"prompt": [5] * 250_000, "echo": True, "logprobs": 20}, 400, "logprobs"),
    ("prompt scores past a message", TEXT, {"prompt": [5] * 250_000, "prompt_logprobs": 20}, 400, "prompt_logprobs"),
    ("prompt scores streamed", TEXT, {"prompt": "x", "prompt_logprobs": 1, "stream": True}, 400, None),
    ("body too large", TEXT, {"prompt": "x" * (3 << 20)}, 413, None),
    ("unknown endpoint", "/v1/embeddings", {"input": "x"}, 404, None),
    ("logit_bias key not an id", TEXT, {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("logit_bias out of range", CHAT, {"messages": MSG, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("logit_bias out of vocab", TEXT, {"prompt": "x", "logit_bias": {"10000000": 1}}, 400, "logit_bias"),
    ("logit_bias key of other digits", TEXT, {"prompt": "x", "logit_bias": {"²": 1}}, 400, "logit_bias"),
    ("logit_bias key of 5,000 digits", TEXT, {"prompt": "x", "logit_bias": {"9" * 5000: 1}}, 400, "logit_bias"),
    ("logit_bias token twice", TEXT, {"prompt": "x", "logit_bias": {"007": 1, "7": -1}}, 400, "logit_bias"),
    ("top_k past int32", TEXT, {"prompt": "x", "top_k": 2**33}, 400, "top_k"),
    ("stop token id past uint32", CHAT, {"messages": MSG, "stop_token_ids": [2**33]}, 400, "stop_token_ids"),
    ("tokenize nothing", "/tokenize", {}, 400, "prompt"),
    ("tokenize no messages", "/tokenize", {"messages": []}, 400, "messages"),
    ("tokenize a bad message", "/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("detokenize a bad id", "/detokenize", {"tokens": [1, 10_000_000]}, 400, "tokens"),
]


@pytest.fixture(scope="module")
def gateway():
    tok = load_tokenizer()
    ok = tok.encode_text("fine")
    gw = ScriptedGateway(lambda r: ([ok], "stop"), settings=GatewaySettings(max_body_bytes=2 << 20))
    yield gw
    gw.close()


@pytest.mark.parametrize("name, path, body, status, param", CASES, ids=[c[0] for c in CASES])
def test_bad_requests_get_error_objects(gateway, name, path, body, status, param):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(gateway.url + path, timeout=30, headers={"Content-Type": "application/json"}, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    # the server keeps serving
    good = httpx.post(gateway.url + TEXT, json={"prompt": [1, 2], "max_tokens": 2}, timeout=30)
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == "fine"


def test_unknown_fields_are_ignored(gateway):
    r = httpx.post(gateway.url + CHAT, json={"messages": MSG, "frobnicate": 3, "metadata": {"a": 1}}, timeout=30)
    assert r.status_code == 200
