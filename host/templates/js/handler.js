// {{name}}: a dedup-host handler. A JSON object payload is greeted onto `<subject>.done`;
// anything else is rejected. A failure is returned by throwing the `failure` variant value:
// { tag: 'reject', val: reason } or { tag: 'retry', val: { reason, delayMs } }.

import { log } from 'dedup:handler/log@0.1.0';
import { get } from 'dedup:handler/config@0.1.0';

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function handle(event) {
  // Input that will never work is rejected: dead-lettered, not retried.
  let body;
  try {
    body = JSON.parse(decoder.decode(event.payload));
  } catch (e) {
    throw { tag: 'reject', val: `malformed: expected a JSON object (${e.message})` };
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw { tag: 'reject', val: 'malformed: expected a JSON object' };
  }
  const greeting = get('greeting') ?? 'hello';
  log('info', 'greeting', [['key', event.key], ['greeting', greeting]]);
  const payload = JSON.stringify({ greeting, key: event.key, event: body });
  return [{
    subject: `${event.subject}.done`,
    payload: encoder.encode(payload),
    headers: [{ name: 'content-type', value: 'application/json' }],
  }];
}

export const handler = { handle };

// Calling another system over HTTP (a notification, a payment API): the route must grant it
// (`[routes.http] allow = ["http://api.example.com/v1/"]`; without the grant a component that
// imports `wasi:http` is refused). Set `"dedup": { "http": true }` in package.json (build.mjs
// then keeps `fetch`), make `handle` async (componentize-js waits for its promise) and call:
//
//   const answer = await fetch('http://api.example.com/v1/send', { method: 'POST', body: payload });
//   if (!answer.ok) throw { tag: 'retry', val: { reason: `notify: ${answer.status}`, delayMs: 1000n } };
//
// The host journals each call under the message's claim and sets its `Idempotency-Key`: a
// re-run of the key gets the recorded answer instead of calling again.
