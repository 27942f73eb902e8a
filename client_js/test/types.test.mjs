import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import test from 'node:test';
import { fileURLToPath } from 'node:url';

// TypeScript is no dependency of the client: bin/setup installs Debian's node-typescript and bin/test
// puts it on NODE_PATH; run without them, where it cannot be resolved, this test is skipped.
let ts = null;
try {
  ts = createRequire(import.meta.url)('typescript');
} catch {
  // not installed
}

test('livepush.d.ts takes what a TypeScript page passes, the browser WebSocket class included', {
  skip: ts ? false : 'TypeScript is not installed',
}, () => {
  const page = fileURLToPath(new URL('./types/page.ts', import.meta.url));
  const program = ts.createProgram([page], {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ES2022,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    lib: ['lib.es2022.d.ts', 'lib.dom.d.ts'],
  });
  const problems = ts.getPreEmitDiagnostics(program).map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  assert.deepEqual(problems, []);
});
