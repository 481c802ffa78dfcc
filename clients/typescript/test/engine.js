// A real engine for the tests: the engine program built from this
// repository, with its embedded NATS server on a free loopback port.

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const repo = resolve(fileURLToPath(new URL("../../..", import.meta.url)));

let built;
function engineBinary() {
  if (!built) {
    const dir = mkdtempSync(join(tmpdir(), "toolbatch-ts-"));
    built = join(dir, "engine");
    execFileSync("go", ["build", "-o", built, "./cmd/engine"], { cwd: repo, stdio: "inherit" });
  }
  return built;
}

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

/** Starts an engine with catalog (a path) and more flags, and resolves once it is ready. */
export async function startEngine(catalog, flags = []) {
  const bin = engineBinary();
  const store = mkdtempSync(join(tmpdir(), "toolbatch-ts-store-"));
  const port = await freePort();
  const proc = spawn(bin, ["--store", store, "--listen", `127.0.0.1:${port}`, "--catalog", catalog, "--log-format", "json", ...flags],
    { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  await new Promise((ok, fail) => {
    proc.stderr.on("data", (d) => {
      log += d;
      if (log.includes('"engine ready"')) ok();
    });
    proc.once("exit", (code) => fail(new Error(`engine exited ${code} before it was ready:\n${log}`)));
  });
  return {
    url: `nats://127.0.0.1:${port}`,
    logs: () => log,
    async stop() {
      const exited = new Promise((ok) => proc.once("exit", ok));
      proc.kill("SIGTERM");
      await exited;
      rmSync(store, { recursive: true, force: true });
    },
  };
}
