"""The conformance guest in Python: the same behaviours as every language's conformance guest.

The route's `mode` config value picks the behaviour:
- `upper` (default): log a line, output the payload upper-cased on `<subject>.done` with
  header `lang`;
- `reject`: reject a payload that is not a JSON object, echo one that is;
- `retry`: ask for a retry until attempt `succeed_on_attempt` (config, default 2), then
  output `succeeded on attempt N`.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import config, log, types

LANG = "python"


def output(event: types.Event, payload: bytes) -> types.Output:
    return types.Output(event.subject + ".done", payload, [types.Header("lang", LANG)])


class Handler(exports.Handler):
    def handle(self, event: types.Event) -> list[types.Output]:
        mode = config.get("mode") or "upper"
        if mode == "upper":
            log.log(log.Level.INFO, "transforming", [("bytes", str(len(event.payload)))])
            return [output(event, event.payload.upper())]
        if mode == "reject":
            if not event.payload.lstrip().startswith(b"{"):
                raise Err(types.Failure_Reject("malformed: expected a JSON object"))
            return [output(event, event.payload)]
        if mode == "retry":
            wanted = int(config.get("succeed_on_attempt") or "2")
            if event.attempt < wanted:
                reason = f"attempt {event.attempt} of {wanted}: not yet"
                raise Err(types.Failure_Retry(types.RetryRequest(reason, 10)))
            return [output(event, f"succeeded on attempt {event.attempt}".encode())]
        raise Err(types.Failure_Reject(f"unknown mode `{mode}`"))
