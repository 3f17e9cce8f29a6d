"""{{name}}: a dedup-host handler. A JSON object payload is greeted onto `<subject>.done`;
anything else is rejected."""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import config, log, types


class Handler(exports.Handler):
    def handle(self, event: types.Event) -> list[types.Output]:
        # Input that will never work is rejected: dead-lettered, not retried.
        try:
            body = json.loads(event.payload)
        except ValueError as e:
            raise Err(types.Failure_Reject(f"malformed: expected a JSON object ({e})"))
        if not isinstance(body, dict):
            raise Err(types.Failure_Reject("malformed: expected a JSON object"))
        greeting = config.get("greeting") or "hello"
        log.log(log.Level.INFO, "greeting", [("key", event.key), ("greeting", greeting)])
        payload = json.dumps({"greeting": greeting, "key": event.key, "event": body})
        headers = [types.Header("content-type", "application/json")]
        return [types.Output(event.subject + ".done", payload.encode(), headers)]


# Calling another system over HTTP (a notification, a payment API): the route must grant it
# (`[routes.http] allow = ["http://api.example.com/v1/"]`; without the grant a component that
# imports `wasi:http` is refused). Put the handler world plus `wasi:http/outgoing-handler` in
# `wit-http/` (copy dedup-host's `guests/python/http-call/wit-http`): `dedup-host build` then
# targets it, and componentize-py's `poll_loop` works. In that world `types` is named
# `dedup_handler_types` (wasi:http has a `types` too): import it `as types` above. The host
# journals each call under the message's claim and sets its `Idempotency-Key`: a re-run of
# the key gets the recorded answer instead of calling again.
#
# import asyncio, sys, wit_world.imports
# from wit_world.imports import wasi_http_types as http
# sys.modules["wit_world.imports.types"] = http  # poll_loop's name for wasi:http/types
# wit_world.imports.types = http
# import poll_loop
#
# async def notify(authority: str, path: str, body: bytes) -> int:
#     request = http.OutgoingRequest(http.Fields.from_list([]))
#     request.set_method(http.Method_Post())
#     request.set_scheme(http.Scheme_Http())
#     request.set_authority(authority)
#     request.set_path_with_query(path)
#     sink = poll_loop.Sink(request.body())
#     answer = asyncio.ensure_future(poll_loop.send(request))  # raises Err(ErrorCode_...)
#     await sink.send(body)
#     sink.close()
#     return (await answer).status()
#
# # in handle():
# #     loop = poll_loop.PollLoop()
# #     asyncio.set_event_loop(loop)
# #     status = loop.run_until_complete(notify("api.example.com", "/v1/send", payload.encode()))
