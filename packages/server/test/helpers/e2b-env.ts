import { execFileSync } from "node:child_process";
import { testAdminKey } from "../../../../test/auth.ts";

/** The variables an E2B user sets; `useE2bEnv` points them at a bothy server and returns the undo. */
const E2B_ENV = ["E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN", "E2B_DEBUG"] as const;

export function useE2bEnv(serverUrl: string): () => void {
  const saved = Object.fromEntries(E2B_ENV.map((name) => [name, process.env[name]]));
  delete process.env["E2B_DOMAIN"];
  delete process.env["E2B_DEBUG"];
  process.env["E2B_API_URL"] = `${serverUrl}/e2b`;
  process.env["E2B_SANDBOX_URL"] = `${serverUrl}/e2b/envd`;
  // E2B keys are bothy keys: the admin key every test server mints (test/auth-setup.ts).
  process.env["E2B_API_KEY"] = testAdminKey();
  return () => {
    for (const name of E2B_ENV) {
      const value = saved[name];
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  };
}

/**
 * Why a Python SDK test cannot run here (`needs` names what to install), or undefined when
 * `import <module>` works in the host's python3.
 */
export function pythonModuleMissing(module: string, needs: string): string | undefined {
  try {
    execFileSync("python3", ["-c", `import ${module}`], { stdio: "ignore" });
    return undefined;
  } catch {
    return needs;
  }
}
