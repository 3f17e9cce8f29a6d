// Builds a JavaScript guest into a component: node build.mjs <source.js> <wit dir> <out.wasm> [--http]
// `--http` (or `"dedup": { "http": true }` in the project's package.json) keeps StarlingMonkey's
// `fetch`, over `wasi:http/outgoing-handler`: the component then imports it, and only a route
// that grants outbound HTTP (`[routes.http]`) accepts it.
import { componentize } from '@bytecodealliance/componentize-js';
import { readFile, writeFile } from 'node:fs/promises';

const [source, witPath, out, ...flags] = process.argv.slice(2);
if (!out) {
  console.error('usage: node build.mjs <source.js> <wit dir> <out.wasm> [--http]');
  process.exit(2);
}
const project = JSON.parse(await readFile('package.json', 'utf8').catch(() => '{}'));
const http = flags.includes('--http') || project.dedup?.http === true;
const { component } = await componentize({
  sourcePath: source,
  witPath,
  worldName: 'handler-guest',
  // Nothing the host does not grant anyway: no incoming HTTP, and no outgoing unless asked.
  disableFeatures: http ? ['fetch-event'] : ['http', 'fetch-event'],
});
await writeFile(out, component);
