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
