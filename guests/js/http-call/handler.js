// Test handler for outbound HTTP in JavaScript: the same contract as the Rust `http-call`
// guest. It makes the calls its payload lists with `fetch` (StarlingMonkey's, over
// `wasi:http/outgoing-handler`; built with `build.mjs --http`), then publishes what each one
// got, status and body or the error, on `<subject>.done`.
//
// Payload: {"calls": [{"url": "http://127.0.0.1:8080/hooks/a", "method": "POST", "body": "hi"}],
// "retry_first_attempt": false}.
// `handle` is async: componentize-js runs the event loop until its promise settles.

const encoder = new TextEncoder();
const decoder = new TextDecoder();

async function call(spec) {
  const method = (spec.method ?? 'POST').toUpperCase();
  const init = { method };
  if (method !== 'GET' && method !== 'HEAD') init.body = spec.body ?? '';
  try {
    const response = await fetch(spec.url, init);
    return { status: response.status, body: await response.text(), error: null };
  } catch (e) {
    return { status: null, body: null, error: String(e?.message ?? e) };
  }
}

async function handle(event) {
  let input;
  try {
    input = JSON.parse(decoder.decode(event.payload));
  } catch (e) {
    throw { tag: 'reject', val: `payload is not a call list: ${e.message}` };
  }
  const results = [];
  for (const spec of input.calls) results.push(await call(spec));
  if (input.retry_first_attempt && event.attempt === 1) {
    throw { tag: 'retry', val: { reason: 'first attempt: retried on purpose', delayMs: 100n } };
  }
  return [{
    subject: `${event.subject}.done`,
    payload: encoder.encode(JSON.stringify(results)),
    headers: [],
  }];
}

export const handler = { handle };
