"""OpenAI error objects: {"error": {"message", "type", "param", "code"}}, 4xx for the client's
mistakes, 5xx only for ours."""

from __future__ import annotations

import grpc


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        """The error in Anthropic's shape, for the Messages API's paths (the field it names
        goes into the message: the shape has no place for it)."""
        kind = ("not_found_error" if self.status == 404 else "request_too_large" if self.status == 413
                else _ANTHROPIC_TYPES.get(self.type, "api_error"))
        message = f"{self.param}: {self.message}" if self.param and not self.message.startswith(self.param) \
            else self.message
        return {"type": "error", "error": {"type": kind, "message": message}}


_ANTHROPIC_TYPES = {"invalid_request_error": "invalid_request_error", "authentication_error": "authentication_error",
                    "rate_limit_error": "rate_limit_error", "service_unavailable": "overloaded_error",
                    "timeout": "timeout_error"}


def anthropic_path(path: str) -> bool:
    """Anthropic's Messages API answers its errors in its own shape."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


_GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.CANCELLED: (503, "service_unavailable"),  # (by the worker: shutting down)
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
}


def from_grpc(exc: grpc.aio.AioRpcError) -> APIError:
    status, kind = _GRPC_TO_HTTP.get(exc.code(), (500, "server_error"))
    return APIError(status, exc.details() or exc.code().name, type=kind, code=exc.code().name.lower())
