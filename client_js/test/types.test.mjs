import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import test from 'node:test';
import { fileURLToPath } from 'node:url';

// TypeScript is no dependency of the client: bin/setup installs Debian's node-typescript and bin/test
// puts it on NODE_PATH; run without them, where it cannot be resolved, these tests are skipped.
let ts = null;
try {
  ts = createRequire(import.meta.url)('typescript');
} catch {
  // not installed
}

/** TypeScript's complaints about `file` (relative to this test) under strict options, with where. */
function typeProblems(file, options = {}) {
  const program = ts.createProgram([fileURLToPath(new URL(file, import.meta.url))], {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ES2022,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    lib: ['lib.es2022.d.ts', 'lib.dom.d.ts'],
    ...options,
  });
  return ts.getPreEmitDiagnostics(program).map((d) => {
    const where = d.file && d.start !== undefined ? `line ${d.file.getLineAndCharacterOfPosition(d.start).line + 1}: ` : '';
    return where + ts.flattenDiagnosticMessageText(d.messageText, '\n');
  });
}

const skip = ts ? false : 'TypeScript is not installed';

test('livepush.d.ts takes what a TypeScript page passes, the browser WebSocket class included', { skip }, () => {
  assert.deepEqual(typeProblems('./types/page.ts'), []);
});

test('livepush.js type-checks against its own JSDoc, as the README says to check it', { skip }, () => {
  assert.deepEqual(typeProblems('../livepush.js', { allowJs: true, checkJs: true }), []);
});
