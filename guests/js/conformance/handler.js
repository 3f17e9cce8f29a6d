// The conformance guest in JavaScript: the same behaviours as every language's conformance
// guest. The route's `mode` config value picks the behaviour:
// - `upper` (default): log a line, output the payload upper-cased on `<subject>.done` with
//   header `lang`;
// - `reject`: reject a payload that is not a JSON object, echo one that is;
// - `retry`: ask for a retry until attempt `succeed_on_attempt` (config, default 2), then
//   output `succeeded on attempt N`.
// A failure is returned by throwing the `failure` variant value.

import { log } from 'dedup:handler/log@0.1.0';
import { get } from 'dedup:handler/config@0.1.0';

const LANG = 'javascript';
const encoder = new TextEncoder();
const decoder = new TextDecoder();

function output(event, payload) {
  return { subject: `${event.subject}.done`, payload, headers: [{ name: 'lang', value: LANG }] };
}

function handle(event) {
  const mode = get('mode') ?? 'upper';
  const text = decoder.decode(event.payload);
  if (mode === 'upper') {
    log('info', 'transforming', [['bytes', String(event.payload.length)]]);
    return [output(event, encoder.encode(text.toUpperCase()))];
  }
  if (mode === 'reject') {
    if (!text.trimStart().startsWith('{')) {
      throw { tag: 'reject', val: 'malformed: expected a JSON object' };
    }
    return [output(event, event.payload)];
  }
  if (mode === 'retry') {
    const wanted = Number(get('succeed_on_attempt') ?? '2');
    if (event.attempt < wanted) {
      const reason = `attempt ${event.attempt} of ${wanted}: not yet`;
      throw { tag: 'retry', val: { reason, delayMs: 10n } };
    }
    return [output(event, encoder.encode(`succeeded on attempt ${event.attempt}`))];
  }
  throw { tag: 'reject', val: `unknown mode \`${mode}\`` };
}

export const handler = { handle };
