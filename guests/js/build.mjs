// Builds a JavaScript guest into a component: node build.mjs <source.js> <wit dir> <out.wasm>
import { componentize } from '@bytecodealliance/componentize-js';
import { writeFile } from 'node:fs/promises';

const [source, witPath, out] = process.argv.slice(2);
if (!out) {
  console.error('usage: node build.mjs <source.js> <wit dir> <out.wasm>');
  process.exit(2);
}
const { component } = await componentize({
  sourcePath: source,
  witPath,
  worldName: 'handler-guest',
  // Nothing the host does not grant anyway: no HTTP.
  disableFeatures: ['http', 'fetch-event'],
});
await writeFile(out, component);
