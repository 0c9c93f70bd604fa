import { readFileSync } from "node:fs";
import { join } from "node:path";

/**
 * On the server's own host, the CLI uses the admin key the first start wrote to
 * `$BOTHY_HOME/admin.key` when BOTHY_API_KEY is unset (readable by root only, as the key file is).
 */
export function useAdminKeyFile(env: NodeJS.ProcessEnv = process.env): void {
  if (env["BOTHY_API_KEY"]) return;
  try {
    const key = readFileSync(join(env["BOTHY_HOME"] ?? "/var/lib/bothy", "admin.key"), "utf8").trim();
    if (key) env["BOTHY_API_KEY"] = key;
  } catch (err) {
    // No such file, or not ours to read: the commands then say that a key is needed.
    if (!["ENOENT", "EACCES", "EPERM", "ENOTDIR"].includes((err as NodeJS.ErrnoException).code ?? "")) throw err;
  }
}
