/**
 * A guest trusts bothy's egress CA, so the gateway can terminate its TLS to the hosts its secrets
 * are bound to: on every boot (new, a warm start from a snapshot, a kept disk, a wake) the CA's
 * certificate, never its key, is written to `/etc/bothy/egress-ca.pem`, appended to the system
 * bundle when the template has one, and every command gets the variables the common TLS stacks
 * read pointing at a bundle that holds it.
 */
import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";

export const GUEST_CA_FILE = "/etc/bothy/egress-ca.pem";
/** The system bundle with the CA in it, or the CA alone when the template has no system bundle. */
export const GUEST_CA_BUNDLE = "/etc/bothy/ca-bundle.crt";
const GUEST_CA_DIR = "/etc/bothy";
const SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt";
/** Debian's is ~0.2 MB; a bundle past this is not one to copy on every boot. */
const MAX_SYSTEM_BUNDLE_BYTES = 16 * 1024 * 1024;

/** What every command of a sandbox under the gateway gets: OpenSSL, curl, Python requests and Node read these. */
export function trustEnv(): Record<string, string> {
  return {
    SSL_CERT_FILE: GUEST_CA_BUNDLE,
    CURL_CA_BUNDLE: GUEST_CA_BUNDLE,
    REQUESTS_CA_BUNDLE: GUEST_CA_BUNDLE,
    NODE_EXTRA_CA_CERTS: GUEST_CA_FILE,
  };
}

/** The CA's certificate as one PEM; refuses anything else, since it is written into every guest. */
function caCertificate(caPem: string): string {
  const pem = caPem.trim();
  if (!/^-----BEGIN CERTIFICATE-----\n[A-Za-z0-9+/=\n]+\n-----END CERTIFICATE-----$/.test(pem))
    throw new BothyError("internal", "The egress CA's certificate is not a single PEM certificate.");
  return pem;
}

/**
 * Installs the CA in a booted guest through the agent's own file requests: no program runs in the
 * guest (a shell script of mkdir, mv, grep, tail and cat cost ~0.18 s of process starts under
 * gVisor's ptrace, on every boot with the gateway). Idempotent: a kept disk whose system bundle
 * holds the CA already is left as it is. Each file is replaced atomically (the three writes are
 * to different files and go out at once, after the directory and the read). A failure is the boot's
 * `trust` step's to report (boot.ts wraps it with this request's error as its cause).
 */
export async function installGuestTrust(agent: AgentClient, caPem: string): Promise<void> {
  const pem = caCertificate(caPem);
  const ca = Buffer.from(`${pem}\n`);
  // A line of the body that only this certificate has (its key and serial are random).
  const lines = pem.split("\n");
  const mark = Buffer.from(`\n${lines[Math.floor(lines.length / 2)] ?? ""}\n`);
  // Requests that do not depend on each other go out together. Under ptrace each request's cost
  // is mostly its hops (the channel, the agent's event loop), not its bytes, and concurrent
  // requests share those waits.
  const dir = agent.mkdir(GUEST_CA_DIR, true);
  const read = agent.readFile(SYSTEM_BUNDLE, MAX_SYSTEM_BUNDLE_BYTES).catch((err: unknown) => {
    if (err instanceof BothyError && err.code === "file_not_found") return undefined;
    throw err;
  });
  const [, system] = await Promise.all([dir, read]);
  const writes = [agent.writeFile(GUEST_CA_FILE, ca, { mode: 0o644 })];
  let bundle = system;
  if (bundle && !bundle.includes(mark)) {
    const newline = bundle.length > 0 && bundle[bundle.length - 1] !== 0x0a ? Buffer.from("\n") : Buffer.alloc(0);
    bundle = Buffer.concat([bundle, newline, ca]);
    writes.push(agent.writeFile(SYSTEM_BUNDLE, bundle, { mode: 0o644 }));
  }
  writes.push(agent.writeFile(GUEST_CA_BUNDLE, bundle ?? ca, { mode: 0o644 }));
  await Promise.all(writes);
}
