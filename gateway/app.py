"""The gateway's FastAPI application: OpenAI endpoints, health, readiness, metrics, auth."""

from __future__ import annotations

import hmac
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers, MutableHeaders

from .. import __version__
from . import endpoints, messages_api, responses_api
from .endpoints import Context
from .errors import APIError, anthropic_path

log = logging.getLogger("dsflash.gateway")


def create_app(ctx: Context) -> FastAPI:
    app = FastAPI(title="dsflash", docs_url=None, redoc_url=None, openapi_url=None)
    started = int(time.time())
    keys = tuple(k for k in ctx.settings.api_keys if k)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        body = exc.anthropic_body() if anthropic_path(request.url.path) else exc.body()
        return JSONResponse(body, status_code=exc.status)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error")
        # Starlette answers this outside every middleware, _EchoRequestId too: the id is put back here.
        client = endpoints.client_request_id(request)
        error = APIError(500, "internal error", type="server_error")
        return JSONResponse(error.anthropic_body() if anthropic_path(request.url.path) else error.body(),
                            status_code=500, headers={"X-Request-Id": client} if client else None)

    # Plain ASGI middleware, not @app.middleware("http"): Starlette's BaseHTTPMiddleware hands
    # the endpoint a `receive` that never reports the client's hang-up, so a whole (unstreamed)
    # request whose client had gone kept its worker decoding to the end. Added last: outermost.
    app.add_middleware(_Authenticate, keys=keys)
    app.add_middleware(_EchoRequestId)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    # /health: the path that load balancers set up for vLLM, SGLang or Dynamo probe; as /readyz.
    @app.get("/readyz")
    @app.get("/health")
    async def readyz():
        if await ctx.router.ready():
            return {"status": "ready"}
        return JSONResponse(APIError(503, "no ready prefill and decode worker", type="service_unavailable").body(),
                            status_code=503)

    @app.get("/health_generate")
    async def health_generate():
        return await endpoints.health_generate(ctx)

    @app.get("/metrics")
    async def metrics():
        body, content_type = ctx.metrics.render()
        return Response(body, media_type=content_type)

    def model_card() -> dict:
        return {"id": ctx.settings.model_name, "object": "model", "created": started, "owned_by": "dsflash",
                "max_model_len": ctx.settings.max_context_tokens}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != ctx.settings.model_name:
            raise APIError(404, f"the model {model_id!r} is not served here; {ctx.settings.model_name!r} is",
                           param="model", code="model_not_found")
        return model_card()

    @app.get("/version")
    async def version():
        return {"version": __version__}

    for path, handler in (("/v1/chat/completions", endpoints.chat_completions),
                          ("/v1/completions", endpoints.completions),
                          ("/tokenize", endpoints.tokenize), ("/detokenize", endpoints.detokenize)):
        app.add_api_route(path, _with_context(handler, ctx), methods=["POST"])

    app.add_api_route("/v1/responses", _with_context(responses_api.create, ctx), methods=["POST"])
    app.add_api_route("/v1/messages", _with_context(messages_api.create, ctx), methods=["POST"])
    app.add_api_route("/v1/messages/count_tokens", _with_context(messages_api.count_tokens, ctx), methods=["POST"])

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str):
        return await responses_api.retrieve(ctx, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return await responses_api.delete(ctx, response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def response_input_items(response_id: str, request: Request):
        return await responses_api.input_item_list(ctx, response_id, request.query_params)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unknown(path: str):
        raise APIError(404, f"unknown endpoint /v1/{path}", code="not_found")

    return app


class _Authenticate:
    """The API key on /v1/ and the tokenizer routes, where keys are set: else a 401."""

    def __init__(self, app, keys: tuple[str, ...]):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and self.keys and (path.startswith("/v1/") or path in ("/tokenize", "/detokenize")):
            headers = Headers(scope=scope)
            header = headers.get("authorization", "")
            # OpenAI's clients send a bearer token, Anthropic's an x-api-key
            token = header[7:].strip() if header.lower().startswith("bearer ") else headers.get("x-api-key", "")
            token_bytes = token.encode("latin-1", "replace")  # (a header's text; compare_digest takes ASCII str only)
            if not any(hmac.compare_digest(token_bytes, k.encode()) for k in self.keys):
                error = APIError(401, "invalid or missing API key", type="authentication_error", code="invalid_api_key")
                refusal = JSONResponse(error.anthropic_body() if anthropic_path(path) else error.body(),
                                       status_code=401)
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _EchoRequestId:
    """A client's X-Request-Id back on every reply, errors and refusals too."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        client = endpoints.client_request_id(Request(scope)) if scope["type"] == "http" else None
        if client is None:
            await self.app(scope, receive, send)
            return

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-Id"] = client
            await send(message)

        await self.app(scope, receive, send_with_id)


def _with_context(handler, ctx: Context):
    """A POST route of the handler: it reads the request's body itself."""
    async def route(request: Request):
        return await handler(ctx, request)

    return route
