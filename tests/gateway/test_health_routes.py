"""The gateway's probes: /healthz always, /readyz and its peers' name /health only while the
router has a ready prefill and decode worker (an OpenAI error object with 503 otherwise)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from dsflash.gateway.app import create_app
from dsflash.gateway.endpoints import Context, GatewaySettings


class _Router:
    def __init__(self):
        self.is_ready = False

    async def ready(self) -> bool:
        if self.is_ready is None:
            raise RuntimeError("the router broke")
        return self.is_ready


@pytest.fixture
def probes():
    router = _Router()
    ctx = Context(settings=GatewaySettings(api_keys=("secret",)), router=router, tokenizer=None, clients=None,
                  metrics=None)
    with TestClient(create_app(ctx)) as client:
        yield router, client


@pytest.mark.parametrize("path", ["/readyz", "/health"])
def test_readiness_follows_the_router(probes, path):
    router, client = probes
    down = client.get(path)
    assert down.status_code == 503
    assert down.json()["error"]["type"] == "service_unavailable"
    router.is_ready = True
    up = client.get(path)
    assert up.status_code == 200 and up.json() == {"status": "ready"}


def test_liveness_ignores_the_workers_and_no_probe_asks_for_a_key(probes):
    _router, client = probes
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/v1/models").status_code == 401  # the key guards /v1/ only
    refused = client.get("/v1/models", headers={"X-Request-Id": "lb-42"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "lb-42"  # refusals carry it too


def test_an_unhandled_error_is_a_500_error_object_that_keeps_the_client_id():
    router = _Router()
    router.is_ready = None  # ready() raises
    ctx = Context(settings=GatewaySettings(), router=router, tokenizer=None, clients=None, metrics=None)
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        broken = client.get("/health", headers={"X-Request-Id": "lb-43"})
        assert broken.status_code == 500 and broken.json()["error"]["type"] == "server_error"
        assert broken.headers["x-request-id"] == "lb-43"
        assert "x-request-id" not in client.get("/health").headers  # none sent, none invented


def test_a_model_is_retrieved_by_its_name_and_the_version_needs_no_key(probes):
    _router, client = probes
    key = {"Authorization": "Bearer secret"}
    card = client.get("/v1/models/deepseek-v4.1-flash", headers=key).json()
    assert card["id"] == "deepseek-v4.1-flash" and card["object"] == "model" and card["max_model_len"] == 1_048_576
    assert card == client.get("/v1/models", headers=key).json()["data"][0]
    other = client.get("/v1/models/gpt-4o", headers=key)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert client.get("/v1/models/deepseek-v4.1-flash").status_code == 401
    from dsflash import __version__

    assert client.get("/version").json() == {"version": __version__}
