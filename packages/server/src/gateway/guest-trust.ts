/**
 * A guest trusts bothy's egress CA, so the gateway can terminate its TLS to the hosts its secrets
 * are bound to: on every boot (new, a warm start from a snapshot, a kept disk, a wake) the CA's
 * certificate, never its key, is written to `/etc/bothy/egress-ca.pem`, appended to the system
 * bundle when the template has one, and every command gets the variables the common TLS stacks
 * read pointing at a bundle that holds it.
 */
import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import { execQuiet } from "../agent/quiet-exec.ts";

export const GUEST_CA_FILE = "/etc/bothy/egress-ca.pem";
/** The system bundle with the CA in it, or the CA alone when the template has no system bundle. */
export const GUEST_CA_BUNDLE = "/etc/bothy/ca-bundle.crt";
const SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt";
const INSTALL_TIMEOUT_MS = 30_000;

/** What every command of a sandbox under the gateway gets: OpenSSL, curl, Python requests and Node read these. */
export function trustEnv(): Record<string, string> {
  return {
    SSL_CERT_FILE: GUEST_CA_BUNDLE,
    CURL_CA_BUNDLE: GUEST_CA_BUNDLE,
    REQUESTS_CA_BUNDLE: GUEST_CA_BUNDLE,
    NODE_EXTRA_CA_CERTS: GUEST_CA_FILE,
  };
}

/** The shell the guest runs to install the CA; idempotent, so a kept disk that has it already is left as it is. */
export function trustScript(caPem: string): string {
  const pem = caPem.trim();
  // Quoted as it is below: a PEM has only base64, dashes, spaces and newlines.
  if (!/^-----BEGIN CERTIFICATE-----\n[A-Za-z0-9+/=\n]+\n-----END CERTIFICATE-----$/.test(pem))
    throw new BothyError("internal", "The egress CA's certificate is not a single PEM certificate.");
  const lines = pem.split("\n");
  // A line of the body that only this certificate has (its key and serial are random).
  const mark = lines[Math.floor(lines.length / 2)] ?? "";
  return [
    "set -e",
    "umask 022",
    "mkdir -p /etc/bothy",
    `printf '%s\\n' '${pem}' > ${GUEST_CA_FILE}.tmp`,
    `mv -f ${GUEST_CA_FILE}.tmp ${GUEST_CA_FILE}`,
    `if [ -f ${SYSTEM_BUNDLE} ]; then`,
    `  if ! grep -qxF '${mark}' ${SYSTEM_BUNDLE}; then`,
    `    if [ -s ${SYSTEM_BUNDLE} ] && [ -n "$(tail -c 1 ${SYSTEM_BUNDLE})" ]; then echo >> ${SYSTEM_BUNDLE}; fi`,
    `    cat ${GUEST_CA_FILE} >> ${SYSTEM_BUNDLE}`,
    "  fi",
    `  cat ${SYSTEM_BUNDLE} > ${GUEST_CA_BUNDLE}.tmp`,
    "else",
    `  cat ${GUEST_CA_FILE} > ${GUEST_CA_BUNDLE}.tmp`,
    "fi",
    `mv -f ${GUEST_CA_BUNDLE}.tmp ${GUEST_CA_BUNDLE}`,
  ].join("\n");
}

/** Installs the CA in a booted guest; throws with what the guest printed when it could not. */
export async function installGuestTrust(agent: AgentClient, caPem: string): Promise<void> {
  const { code, output } = await execQuiet(agent, trustScript(caPem), INSTALL_TIMEOUT_MS, "Installing the egress CA");
  if (code !== 0)
    throw new BothyError(
      "create_failed",
      `Installing the egress CA in the guest failed (exit ${code}): ${output.trim().slice(-300)}`,
    );
}
