/**
 * Runs the agent on a bothy sandbox with the scripted model and prints the transcript as JSON. BOTHY_URL and BOTHY_API_KEY name the server; BOTHY_SANDBOX_ID an existing
 * sandbox to use, else a new one is made (and killed at the end).
 *
 *   npx tsx examples/ts-agent/main.ts
 */
import { Sandbox } from "@bothy/sdk";
import { runAgent } from "./agent.ts";
import { DEMO_SCRIPT, scriptedModel } from "./stub-model.ts";

const existing = process.env["BOTHY_SANDBOX_ID"];
const sandbox = existing ? await Sandbox.connect(existing) : await Sandbox.create({ template: "seed" });
try {
  // A real model goes here instead (README.md): the loop and the tools stay as they are.
  const model = scriptedModel(DEMO_SCRIPT);
  const run = await runAgent(model, sandbox, "Draw a small PNG with Python in the sandbox and look at it.");
  process.stdout.write(`${JSON.stringify(run, null, 2)}\n`);
} finally {
  if (!existing) await sandbox.kill();
}
