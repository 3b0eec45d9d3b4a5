// The CommonJS side: `require` resolves dist/cjs and its .d.ts.
import rr = require('redis-ratelimit');
export const store: rr.RLStore = new rr.RLStore({ sendCommand: async () => 1 });
