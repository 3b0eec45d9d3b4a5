// Marks dist/cjs as CommonJS (the package itself is "type": "module"), so
// Node loads dist/cjs/*.js with require and TypeScript reads its .d.ts as CJS.
import { writeFileSync } from 'node:fs';
writeFileSync(new URL('../dist/cjs/package.json', import.meta.url), JSON.stringify({ type: 'commonjs' }) + '\n');
