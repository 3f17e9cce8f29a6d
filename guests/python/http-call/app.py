"""Test handler for outbound HTTP in Python: the same contract as the Rust `http-call` guest.

It makes the calls its payload lists through `wasi:http/outgoing-handler`, with
componentize-py's own `poll_loop` (an asyncio loop over `wasi:io/poll`), then publishes what
each one got, status and body or the error code, on `<subject>.done`.

Payload: `{"calls": [{"url": "http://127.0.0.1:8080/hooks/a", "method": "POST", "body": "hi"}],
"retry_first_attempt": false}`.
"""

import asyncio
import json
import sys

import wit_world.imports
from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import dedup_handler_types as types
from wit_world.imports import wasi_http_types as http

# poll_loop imports wasi:http's `types` by its short name; in this world the short name is
# shared with dedup:handler/types, so componentize-py names both by package. Alias it first.
sys.modules["wit_world.imports.types"] = http
wit_world.imports.types = http
import poll_loop  # noqa: E402  (after the alias above)

METHODS = {
    "GET": http.Method_Get,
    "POST": http.Method_Post,
    "PUT": http.Method_Put,
    "DELETE": http.Method_Delete,
}


def request_for(spec: dict) -> http.OutgoingRequest:
    scheme, rest = spec["url"].split("://", 1)
    authority, slash, path = rest.partition("/")
    request = http.OutgoingRequest(http.Fields.from_list([]))
    method = spec.get("method", "POST").upper()
    request.set_method(METHODS[method]() if method in METHODS else http.Method_Other(method))
    request.set_scheme(http.Scheme_Http() if scheme == "http" else http.Scheme_Other(scheme))
    request.set_authority(authority)
    request.set_path_with_query(slash + path if slash else "/")
    return request


async def call(spec: dict) -> dict:
    """One call: its status and body, or the error code the host answered."""
    request = request_for(spec)
    sink = poll_loop.Sink(request.body())
    try:
        answer = asyncio.ensure_future(poll_loop.send(request))
        await sink.send(spec.get("body", "").encode())
        sink.close()
        response = await answer
    except Err as e:
        return {"status": None, "body": None, "error": type(e.value).__name__}
    stream = poll_loop.Stream(response.consume())
    body = b""
    while (chunk := await stream.next()) is not None:
        body += chunk
    return {"status": response.status(), "body": body.decode(errors="replace"), "error": None}


async def call_all(calls: list) -> list:
    return [await call(spec) for spec in calls]


class Handler(exports.Handler):
    def handle(self, event: types.Event) -> list[types.Output]:
        try:
            payload = json.loads(event.payload)
        except ValueError as e:
            raise Err(types.Failure_Reject(f"payload is not a call list: {e}"))
        loop = poll_loop.PollLoop()
        asyncio.set_event_loop(loop)
        results = loop.run_until_complete(call_all(payload["calls"]))
        if payload.get("retry_first_attempt") and event.attempt == 1:
            reason = "first attempt: retried on purpose"
            raise Err(types.Failure_Retry(types.RetryRequest(reason, 100)))
        return [types.Output(event.subject + ".done", json.dumps(results).encode(), [])]
