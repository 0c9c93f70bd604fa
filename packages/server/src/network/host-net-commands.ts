/**
 * The `ip` and `nft` commands host-network.ts runs, and what it reads back: a table's chains, map
 * and set elements, the host's links, addresses and default route, the network namespaces. Each
 * spawn costs the server a fork of its whole address space, so callers batch (`ipBatch`, `nft -f`).
 */
import { existsSync } from "node:fs";
import { HostCommandError, run } from "../util/host-command.ts";
import { GATEWAY_SET } from "./nft-ruleset.ts";

/** Where `ip netns` keeps its named namespaces. */
export const NETNS_DIR = "/run/netns";
export const CMD_TIMEOUT_MS = 15_000;

/** One table's rules as host-network.ts needs them. */
export interface TableRules {
  chains: string[];
  elements: Array<{ key: string; target: string }>;
  gateway: Array<{ iface: string; guest: string }>;
}

/** A table's chains and verdict-map elements; undefined when there is no such table. */
export async function listRules(table: string): Promise<TableRules | undefined> {
  let text: string;
  try {
    text = (await run("nft", ["-j", "list", "table", ...table.split(" ")], { timeoutMs: CMD_TIMEOUT_MS })).stdout;
  } catch (err) {
    if (noSuchObject(err)) return undefined;
    throw err;
  }
  const items = (JSON.parse(text) as { nftables?: Array<Record<string, unknown>> }).nftables ?? [];
  const chains: string[] = [];
  const elements: Array<{ key: string; target: string }> = [];
  const gateway: Array<{ iface: string; guest: string }> = [];
  for (const item of items) {
    const set = item["set"] as { name?: string; elem?: unknown[] } | undefined;
    if (set?.name === GATEWAY_SET)
      for (const el of set.elem ?? []) {
        const [iface, guest] = (el as { concat?: unknown[] }).concat ?? [];
        if (typeof iface === "string" && typeof guest === "string") gateway.push({ iface, guest });
      }
    const chain = item["chain"] as { name?: string } | undefined;
    if (chain?.name) chains.push(chain.name);
    const map = item["map"] as { name?: string; elem?: unknown[] } | undefined;
    if (map?.name !== "egress") continue;
    for (const el of map.elem ?? []) {
      if (!Array.isArray(el) || typeof el[0] !== "string") continue;
      const verdict = el[1] as { goto?: { target?: string }; jump?: { target?: string } } | undefined;
      elements.push({ key: el[0], target: verdict?.goto?.target ?? verdict?.jump?.target ?? "" });
    }
  }
  return { chains, elements, gateway };
}

export async function ipBatch(lines: string[], netns?: string): Promise<void> {
  await run("ip", [...(netns ? ["-n", netns] : []), "-batch", "-"], {
    timeoutMs: CMD_TIMEOUT_MS,
    input: lines.join("\n") + "\n",
  });
}

export async function nft(script: string): Promise<void> {
  await run("nft", ["-f", "-"], { timeoutMs: CMD_TIMEOUT_MS, input: script });
}

export async function listLinks(): Promise<Array<{ name: string; alias: string | undefined }>> {
  const { stdout } = await run("ip", ["-j", "link", "show"], { timeoutMs: CMD_TIMEOUT_MS });
  return (JSON.parse(stdout || "[]") as Array<{ ifname: string; ifalias?: string }>).map((l) => ({
    name: l.ifname,
    alias: l.ifalias,
  }));
}

export async function linkNames(): Promise<string[]> {
  return (await listLinks()).map((l) => l.name);
}

export async function hostAddresses(): Promise<string[]> {
  const { stdout } = await run("ip", ["-j", "-4", "addr", "show"], { timeoutMs: CMD_TIMEOUT_MS });
  return (JSON.parse(stdout || "[]") as Array<{ addr_info?: Array<{ local?: string }> }>)
    .flatMap((l) => (l.addr_info ?? []).map((a) => a.local ?? ""))
    .filter(Boolean);
}

export async function defaultRouteInterface(): Promise<string> {
  const { stdout } = await run("ip", ["-j", "-4", "route", "show", "default"], { timeoutMs: CMD_TIMEOUT_MS });
  return (JSON.parse(stdout || "[]") as Array<{ dev?: string }>)[0]?.dev ?? "";
}

/** Those of the named network namespaces that exist. */
export function existingNamespaces(names: string[]): string[] {
  return names.filter((ns) => existsSync(`${NETNS_DIR}/${ns}`));
}

/** nft's answer for a table or chain that does not exist. */
export function noSuchObject(err: unknown): boolean {
  return err instanceof HostCommandError && /No such file or directory/.test(err.stderr);
}
