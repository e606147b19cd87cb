"""Metrics and logs after real requests through `dsflash serve`: DESIGN.md's names and types,
values that moved, no per-conversation label values, and the `request_end` line."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway_harness import ServeProcess

pytestmark = pytest.mark.slow

EXPECTED = {  # DESIGN.md: name -> type
    "dsflash_time_to_first_token_seconds": "histogram",
    "dsflash_inter_token_latency_seconds": "histogram",
    "dsflash_request_duration_seconds": "histogram",
    "dsflash_prompt_tokens": "counter",
    "dsflash_generation_tokens": "counter",
    "dsflash_cached_prompt_tokens": "counter",
    "dsflash_spec_accept_length": "histogram",
    "dsflash_decode_step_seconds": "histogram",
    "dsflash_kv_transfer_bytes": "counter",
    "dsflash_kv_transfer_seconds": "histogram",
    "dsflash_kv_host_cache_bytes": "gauge",
    "dsflash_requests_running": "gauge",
    "dsflash_requests_waiting": "gauge",
    "dsflash_prefill_queue_tokens": "gauge",
}


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("obs") / "serve.log"
    process = ServeProcess(tiny_checkpoint, log)
    client = openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0)
    # greedy, so that the counts below do not depend on what a sample happens to be
    history = [{"role": "user", "content": "Say something."}]
    first = client.chat.completions.create(model="m", messages=history, max_tokens=6, temperature=0,
                                           extra_body={"thinking": {"type": "disabled"}},
                                           extra_headers={"X-Conversation-Id": "obs-conversation-1"})
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "More."}]
    list(client.chat.completions.create(model="m", messages=history, max_tokens=6, temperature=0, stream=True,
                                        extra_body={"thinking": {"type": "disabled"}},
                                        extra_headers={"X-Conversation-Id": "obs-conversation-1"}))
    client.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=5, temperature=0)
    yield process, log
    process.close()


def _families(url):
    text = httpx.get(f"{url}/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def test_metric_names_types_and_values(served):
    process, _ = served
    families, text = _families(process.url)
    for name, kind in EXPECTED.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)
    roles = {s.labels.get("role") for f in families.values() for s in f.samples}
    assert {"gateway", "prefill", "decode"} <= roles

    def value(name, role, suffix="", **labels):
        return sum(s.value for s in families[name].samples
                   if s.name == name + suffix and s.labels.get("role") == role
                   and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("dsflash_generation_tokens", "gateway", "_total") >= 17
    assert value("dsflash_prompt_tokens", "decode", "_total") > 0
    assert value("dsflash_time_to_first_token_seconds", "gateway", "_count") == 3
    assert value("dsflash_decode_step_seconds", "decode", "_count") > 0
    assert value("dsflash_spec_accept_length", "decode", "_count") > 0
    assert value("dsflash_kv_transfer_bytes", "prefill", "_total") > 0
    assert value("dsflash_prefill_computed_tokens", "prefill", "_total") > 0
    assert value("dsflash_cached_prompt_tokens", "gateway", "_total") > 0  # the second turn reused the first
    assert value("dsflash_kv_host_cache_bytes", "decode") > 0  # the conversation's cache is kept
    assert value("dsflash_requests", "gateway", "_total", finish_reason="length") == 3
    assert "obs-conversation-1" not in text  # conversation ids never become label values


def test_request_end_log_lines(served):
    _, log = served
    lines = [line for line in log.read_text().splitlines() if " request_end " in line]
    assert len(lines) == 3
    fields = dict(re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", lines[1].split(" request_end ", 1)[1]))
    for key in ("request_id", "conversation_id", "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms",
                "average_iteration_ms", "average_accept_length"):
        assert key in fields, key
    assert fields["conversation_id"] == "obs-conversation-1"
    assert int(fields["cached_tokens"]) > 0 and int(fields["completion_tokens"]) == 6
    assert float(fields["ttft_ms"]) > 0 and float(fields["average_accept_length"]) >= 1
