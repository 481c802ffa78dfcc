// The example agent loop against a real engine with its catalog.

import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";

import { Client } from "../src/index.js";
import { loop } from "../examples/agentloop.js";
import { repo, startEngine } from "./engine.js";

test("the example agent loop runs to its end", async () => {
  const engine = await startEngine(join(repo, "examples/agentloop/catalog.yaml"));
  const c = await Client.connect({ servers: engine.url });
  try {
    const lines = [];
    const heard = await loop(c, "ts-loop-1", (l) => lines.push(l));
    assert.deepEqual(heard, [
      ['toolu_01 error=false {"text":"ping"}', 'toolu_02 error=false {"subject":"deploy","to":"ops@example.com"}'],
      ["call_1 eu-west-1", "call_2 Error: invalid arguments: the input must be a JSON object, got a string"],
    ]);
    assert.match(lines.at(-1), /^model: Done: /);
  } finally {
    await c.close();
    await engine.stop();
  }
});
