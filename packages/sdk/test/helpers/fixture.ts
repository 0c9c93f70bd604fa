import { Sandbox, type SandboxCreateOptions } from "../../src/index.ts";

/**
 * Runs `fn` with a fresh sandbox and always deletes it afterwards, whatever `fn` did; on failure
 * the sandbox id is logged so the server log can be searched for it.
 */
export async function withSandbox<T>(
  baseUrl: string,
  fn: (sandbox: Sandbox) => Promise<T>,
  options: SandboxCreateOptions = {},
): Promise<T> {
  const sandbox = await Sandbox.create({ baseUrl, ...options });
  try {
    return await fn(sandbox);
  } catch (err) {
    process.stderr.write(`test failed with sandbox ${sandbox.sandboxId}\n`);
    throw err;
  } finally {
    await Sandbox.kill(sandbox.sandboxId, { baseUrl });
  }
}
