import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import { execQuiet } from "../agent/quiet-exec.ts";
import type { GuestNetwork } from "../drivers/driver.ts";
import { parseIpv4 } from "./ipv4.ts";
import { NetworkSetupError } from "../errors/internal-errors.ts";

const CONFIGURE_TIMEOUT_MS = 15_000;

/** The shell line a VM guest runs to take its address (the kernel's `ip=` does nothing here). */
export function guestNetworkScript(net: GuestNetwork): string {
  // Every value is re-checked as an address: this line runs in a shell.
  for (const a of [net.guest, net.gateway]) parseIpv4(a);
  if (!Number.isInteger(net.prefix)) throw new BothyError("internal", "bad prefix");
  const bb = "/opt/bothy/busybox";
  return [
    // No IPv6 in the guest at all: the host drops it anyway, and an address would only mislead.
    'for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do [ -e "$f" ] && echo 1 > "$f"; done',
    `${bb} ip link set lo up`,
    `${bb} ip addr flush dev eth0`,
    `${bb} ip addr add ${net.guest}/${net.prefix} dev eth0`,
    `${bb} ip link set eth0 up`,
    `${bb} ip route replace default via ${net.gateway} dev eth0`,
  ].join(" && ");
}

export const resolvConf = (dns: readonly string[]): string => `${dns.map((d) => `nameserver ${d}`).join("\n")}\n`;

/**
 * Gives a VM guest its address, route and resolvers over the agent channel, after identity: a
 * restored clone of a warm-start snapshot booted before its network existed.
 */
export async function configureGuestNetwork(agent: AgentClient, net: GuestNetwork): Promise<void> {
  for (const d of net.dns) parseIpv4(d);
  const { code, output } = await execQuiet(
    agent,
    guestNetworkScript(net),
    CONFIGURE_TIMEOUT_MS,
    "Configuring the guest's network",
  );
  if (code !== 0)
    throw new NetworkSetupError(`Configuring the guest's network failed (exit ${code ?? "none"}).`, {
      diagnostics: output.slice(-500),
    });
  await agent.writeFile("/etc/resolv.conf", Buffer.from(resolvConf(net.dns)), { mode: 0o644 });
}
