/**
 * Per-sandbox networking on the host: a /30 from the pool for each sandbox, the link (a veth into
 * the sandbox's own network namespace for gVisor, a tap for VMs), and the sandbox's nftables chain.
 * Names derive from the home's tag and the sandbox id (util/host-names.ts), so every object can be
 * found again without memory, and only objects with this home's tag are ever listed or removed:
 * the namespace `bothy-<tag>-<id suffix>`, the interface `bv<tag>-…`/`bt<tag>-…` (its alias holds
 * the full id) and the chain `sbx_…` in table `inet bothy-<tag>`.
 */
import { existsSync } from "node:fs";
import { readdir, readFile, writeFile } from "node:fs/promises";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import type { EgressPolicy, GuestNetwork, HostObject } from "../drivers/driver.ts";
import { run } from "../util/host-command.ts";
import { ifaceName, LEGACY, netnsName, nftTable, type LinkKind } from "../util/host-names.ts";
import { cidrContains, cidrsOverlap, formatCidr, parseCidr, parseIpv4 } from "./ipv4.ts";
import { PRIVATE_RANGES, renderBase, renderSandboxAdd, renderSandboxRemove, type GatewayPorts } from "./nft-ruleset.ts";
import type { Logger } from "../events/server-events.ts";
import { neverOpen, permitProblem } from "./allow-out.ts";
import { HostSetupError, NetworkSetupError } from "../errors/internal-errors.ts";
import {
  CMD_TIMEOUT_MS,
  defaultRouteInterface,
  existingNamespaces,
  hostAddresses,
  ipBatch,
  linkNames,
  listLinks,
  listRules,
  NETNS_DIR,
  nft,
  noSuchObject,
} from "./host-net-commands.ts";
import { SubnetPool } from "./subnet-pool.ts";

export type { LinkKind } from "../util/host-names.ts";

export interface HostNetworkOptions {
  /** The home's tag (util/host-names.ts), carried by every object made here. */
  tag: string;
  /** The home's sandbox directories: an object under the untagged names is this home's only if its sandbox's directory is here. */
  sandboxesDir: string;
  pool: string;
  /** Default: the default route's interface. */
  uplink: string | undefined;
  dns: string[];
  extraBlocked: string[];
  /** BOTHY_ALLOW_OUT_PERMIT, checked at start-up (create-request.ts judges each `allow_out` against it). */
  allowOutPermit?: string[];
  /** The egress gateway's ports (gateway/egress-proxy.ts); sandboxes with `gateway` have their TCP 80/443 redirected there. */
  gatewayPorts?: GatewayPorts;
  log: Logger;
}

/** A sandbox's network as planned: names and addresses are fixed before anything is made. */
export interface PlannedNetwork {
  sandboxId: string;
  kind: LinkKind;
  iface: string;
  policy: EgressPolicy;
  guest: GuestNetwork;
}

/**
 * Run by `sh -c` inside a new namespace before eth0 is up: turns IPv6 off for every interface
 * there, so eth0 never gets a link-local address for gVisor to copy. A line of `ip -batch` ends
 * its quoted word at the next quote of the same kind and drops what follows a `#`: no single
 * quote and no `#` here.
 */
const NS_IPV6_OFF =
  "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6";
/** Then configures the namespace with one `ip -batch`: $1 is eth0's address/prefix, $2 the gateway. */
const NS_CONFIGURE = `printf "%s\\n" "addr add $1 dev eth0" "link set eth0 up" "link set lo up" "route add default via $2" | ip -batch -`;

export class HostNetwork {
  /** The sandboxes' subnets; one is free again only once its sandbox's teardown succeeded. */
  private readonly subnets: SubnetPool;
  /** The egress policy of each sandbox with a subnet, for the gateway's lookups by guest address. */
  private readonly policies = new Map<string, EgressPolicy>();
  /** The sandboxes this server plumbed whole, as planned: their teardown needs no listing. */
  private readonly made = new Map<string, PlannedNetwork>();
  private uplinkName = "";
  private ipv6 = false;
  /**
   * The tables a sandbox of this home may have rules in: its own, and the untagged one of an
   * older bothy if that was there at start-up.
   */
  private tables: string[];
  private readonly table: string;
  private readonly netnsRe: RegExp;
  private readonly ifaceRe: RegExp;

  constructor(private readonly opts: HostNetworkOptions) {
    this.subnets = new SubnetPool(opts.pool);
    this.table = nftTable(opts.tag);
    this.tables = [this.table];
    this.netnsRe = new RegExp(`^bothy-${opts.tag}-([a-z2-7]{20})$`);
    this.ifaceRe = new RegExp(`^b[vt]${opts.tag}-[a-z2-7]{8}$`);
  }

  get uplink(): string {
    return this.uplinkName;
  }

  get dns(): string[] {
    return this.opts.dns;
  }

  /**
   * Checks the host can give sandboxes a network and installs the base ruleset. Every failure
   * says what to run, or to start with BOTHY_NETWORK=off.
   */
  async preflight(): Promise<void> {
    const off = "or start bothy with BOTHY_NETWORK=off (sandboxes then have no network at all)";
    await run("nft", ["--version"], { timeoutMs: CMD_TIMEOUT_MS }).catch((err: unknown) => {
      throw new HostSetupError(`nft is not installed: run \`apt-get install nftables\`, ${off}.`, {
        cause: err,
      });
    });
    await run("ip", ["-V"], { timeoutMs: CMD_TIMEOUT_MS }).catch((err: unknown) => {
      throw new HostSetupError(`ip is not installed: run \`apt-get install iproute2\`, ${off}.`, {
        cause: err,
      });
    });
    this.uplinkName = this.opts.uplink ?? (await defaultRouteInterface());
    if (!this.uplinkName)
      throw new HostSetupError(
        `No uplink: this host has no default route; set BOTHY_UPLINK to the interface sandboxes reach the internet by, ${off}.`,
      );
    if (!(await linkNames()).includes(this.uplinkName))
      throw new HostSetupError(
        `The uplink interface ${this.uplinkName} does not exist; set BOTHY_UPLINK to an existing interface, ${off}.`,
      );
    for (const server of this.opts.dns) {
      const addr = parseIpv4(server);
      const blocked = [...PRIVATE_RANGES, this.opts.pool, ...this.opts.extraBlocked].find((r) =>
        cidrContains(parseCidr(r), addr),
      );
      if (blocked)
        throw new HostSetupError(
          `BOTHY_DNS names ${server}, inside ${blocked}, which sandboxes may not reach; name public resolvers (default 1.1.1.1,8.8.8.8).`,
        );
    }
    for (const r of this.opts.extraBlocked) parseCidr(r);
    const permitWrong = permitProblem(this.opts.allowOutPermit ?? [], this.opts.pool);
    if (permitWrong)
      throw new HostSetupError(
        `BOTHY_ALLOW_OUT_PERMIT: ${permitWrong}; list only the private blocks sandboxes may be opened to (e.g. 10.20.0.0/16), or leave it empty.`,
      );
    const shared = await this.poolOfAnotherHome();
    if (shared)
      throw new HostSetupError(
        `BOTHY_NET_POOL ${formatCidr(this.subnets.cidr)} overlaps ${shared.pool}, the pool of another bothy home on this host (table inet ${shared.table}); give each server its own block. If no server of that home runs any more, \`nft delete table inet ${shared.table}\` removes its rules.`,
      );
    for (const clash of (await hostAddresses()).filter((a) => cidrContains(this.subnets.cidr, parseIpv4(a)))) {
      if (!(await this.isOurs(clash)))
        throw new HostSetupError(
          `BOTHY_NET_POOL ${formatCidr(this.subnets.cidr)} holds ${clash}, an address this host already uses; choose a free block.`,
        );
    }
    if (PRIVATE_RANGES.every((r) => !cidrsOverlap(parseCidr(r), this.subnets.cidr)))
      this.opts.log("network_pool_public", { pool: formatCidr(this.subnets.cidr) });
    await this.ensureForwarding();
    this.ipv6 = existsSync("/proc/sys/net/ipv6");
    await nft(
      renderBase({
        tag: this.opts.tag,
        pool: formatCidr(this.subnets.cidr),
        uplink: this.uplinkName,
        extraBlocked: this.opts.extraBlocked,
        ...(this.opts.gatewayPorts ? { gatewayPorts: this.opts.gatewayPorts } : {}),
      }),
    );
    this.tables = (await listRules(LEGACY.table)) !== undefined ? [this.table, LEGACY.table] : [this.table];
    this.opts.log("network_ready", {
      pool: formatCidr(this.subnets.cidr),
      uplink: this.uplinkName,
      dns: this.opts.dns,
      table: this.table,
    });
  }

  /**
   * Another home's table in this namespace whose pool (the source its postrouting masquerades)
   * overlaps ours: both servers would route the same /30s to their own interfaces.
   */
  private async poolOfAnotherHome(): Promise<{ table: string; pool: string } | undefined> {
    const { stdout } = await run("nft", ["-j", "list", "tables"], { timeoutMs: CMD_TIMEOUT_MS });
    const tables = (
      (JSON.parse(stdout) as { nftables?: Array<{ table?: { family?: string; name?: string } }> }).nftables ?? []
    )
      .flatMap((i) => (i.table?.family === "inet" && i.table.name ? [i.table.name] : []))
      .filter((name) => /^bothy-[a-z2-7]{4}$/.test(name) && `inet ${name}` !== this.table);
    for (const table of tables) {
      const listed = await run("nft", ["-j", "list", "chain", "inet", table, "postrouting"], {
        timeoutMs: CMD_TIMEOUT_MS,
      }).catch((err: unknown) => {
        // A table without that chain masquerades nothing.
        if (noSuchObject(err)) return undefined;
        throw err;
      });
      const items = (JSON.parse(listed?.stdout || "{}") as { nftables?: Array<{ rule?: { expr?: unknown[] } }> })
        .nftables;
      for (const expr of (items ?? []).flatMap((i) => i.rule?.expr ?? [])) {
        const match = (expr as { match?: { left?: { payload?: { field?: string } }; right?: unknown } }).match;
        const prefix = (match?.right as { prefix?: { addr?: string; len?: number } } | undefined)?.prefix;
        if (match?.left?.payload?.field !== "saddr" || prefix?.addr === undefined || prefix.len === undefined) continue;
        const pool = `${prefix.addr}/${prefix.len}`;
        if (cidrsOverlap(parseCidr(pool), this.subnets.cidr)) return { table, pool };
      }
    }
    return undefined;
  }

  /** Only an address on one of our own interfaces (a leftover reconcile will remove) may sit in the pool. */
  private async isOurs(addr: string): Promise<boolean> {
    const { stdout } = await run("ip", ["-j", "-4", "addr", "show", "to", `${addr}/32`], { timeoutMs: CMD_TIMEOUT_MS });
    const links = await listLinks();
    return (JSON.parse(stdout || "[]") as Array<{ ifname?: string }>).every((holder) => {
      const link = links.find((l) => l.name === holder.ifname);
      return link !== undefined && this.isOwnLink(link);
    });
  }

  /**
   * A link this home made: its tag in the name and a sandbox id as alias, or the untagged name of
   * a sandbox whose directory is in this home (made before names carried the tag).
   */
  private isOwnLink(link: { name: string; alias: string | undefined }): boolean {
    if (!link.alias || !SANDBOX_ID_RE.test(link.alias)) return false;
    if (this.ifaceRe.test(link.name)) return true;
    return LEGACY.ifaceRe.test(link.name) && this.hasSandboxDir(link.alias);
  }

  private hasSandboxDir(sandboxId: string): boolean {
    return existsSync(join(this.opts.sandboxesDir, sandboxId));
  }

  private async ensureForwarding(): Promise<void> {
    const path = "/proc/sys/net/ipv4/ip_forward";
    if ((await readFile(path, "utf8")).trim() === "1") return;
    try {
      await writeFile(path, "1\n");
    } catch (err) {
      throw new HostSetupError(
        `net.ipv4.ip_forward is off and bothy could not turn it on: run \`sysctl -w net.ipv4.ip_forward=1\` as root, or start bothy with BOTHY_NETWORK=off.`,
        { cause: err },
      );
    }
    this.opts.log("ip_forward_enabled", {
      sysctl: "net.ipv4.ip_forward=1",
      why: "sandboxes' traffic is routed through this host",
    });
  }

  /** Reserves the sandbox's subnet and names; nothing exists on the host until `plumb`. */
  allocate(sandboxId: string, kind: LinkKind, policy: EgressPolicy): PlannedNetwork {
    const subnet = this.subnets.allocate(sandboxId);
    const iface = ifaceName(this.opts.tag, sandboxId, kind);
    this.policies.set(sandboxId, policy);
    const guest: GuestNetwork = {
      guest: subnet.guest,
      gateway: subnet.gateway,
      prefix: subnet.prefix,
      dns: this.opts.dns,
      ...(kind === "veth" ? { netns: netnsName(this.opts.tag, sandboxId) } : { tap: iface }),
    };
    return { sandboxId, kind, iface, policy, guest };
  }

  /** Every address no sandbox reaches unless its `allow_out` names it: the private ranges, the pool, BOTHY_NET_BLOCK. */
  get blocked(): string[] {
    return [...PRIVATE_RANGES, formatCidr(this.subnets.cidr), ...this.opts.extraBlocked];
  }

  /**
   * Every address no sandbox reaches whatever its `allow_out` says: loopback, 0/8, the pool, and
   * each address the host has right now (the gateway dials from the host, where the nft input
   * chain does not see it).
   */
  get unreachable(): string[] {
    const own = Object.values(networkInterfaces())
      .flat()
      .flatMap((a) => (a?.family === "IPv4" ? [`${a.address}/32`] : []));
    return [...neverOpen(this.opts.pool), ...own];
  }

  /**
   * The address a sandbox of this server has on its own link, from its allocation (never from
   * anything a client sent); undefined for a sandbox with no network here. The port proxy dials it.
   */
  guestAddress(sandboxId: string): string | undefined {
    return this.subnets.of(sandboxId)?.guest;
  }

  /**
   * The sandbox whose guest address this is, and its egress policy; undefined for any address that
   * is not a live sandbox's guest (the gateway refuses those).
   */
  byGuest(address: string): { sandboxId: string; policy: EgressPolicy } | undefined {
    const sandboxId = this.subnets.byGuest(address);
    const policy = sandboxId === undefined ? undefined : this.policies.get(sandboxId);
    return sandboxId !== undefined && policy ? { sandboxId, policy } : undefined;
  }

  /**
   * Takes over the network of a sandbox that outlived a server restart: its link's gateway
   * address says which subnet it has, and its chain must still be there. The link stays as it is;
   * the chain is written again from the sandbox's stored policy in one atomic `nft -f`, so a chain
   * an older server wrote (without the fixed refusals, say) carries today's rules from the takeover
   * on. Undefined when the network is not whole (the sandbox is then stopped and rebuilt), as for a
   * sandbox whose network has the untagged names of an older bothy.
   */
  async adopt(sandboxId: string, kind: LinkKind, policy: EgressPolicy): Promise<PlannedNetwork | undefined> {
    const iface = ifaceName(this.opts.tag, sandboxId, kind);
    const shown = await run("ip", ["-j", "-4", "addr", "show", "dev", iface], { timeoutMs: CMD_TIMEOUT_MS }).catch(
      () => undefined,
    );
    const local = (JSON.parse(shown?.stdout || "[]") as Array<{ addr_info?: Array<{ local?: string }> }>)[0]
      ?.addr_info?.[0]?.local;
    if (local === undefined || !this.subnets.claimable(sandboxId, local)) return undefined;
    if (kind === "veth" && !existsSync(`${NETNS_DIR}/${netnsName(this.opts.tag, sandboxId)}`)) return undefined;
    if (!(await listRules(this.table))?.chains.includes(sandboxId)) return undefined;
    this.subnets.claim(sandboxId, local);
    const plan = this.allocate(sandboxId, kind, policy);
    await nft(renderSandboxAdd({ table: this.table, sandboxId, iface, guest: plan.guest.guest, policy }));
    return plan;
  }

  /**
   * Makes the link and the chain: one `ip -batch` and one `nft -f`, as each program the server
   * spawns costs it a fork of its whole address space. A plumb that fails leaves what it made for
   * `teardown`, which removes whatever of it exists: the boot pipeline pushed that undo before
   * calling this.
   */
  async plumb(plan: PlannedNetwork): Promise<void> {
    const { iface, guest } = plan;
    const cidr = (a: string) => `${a}/${guest.prefix}`;
    const started = Date.now();
    // With addrgenmode none the host end gets no IPv6 link-local when it comes up; disable_ipv6,
    // written once the batch is done, then turns IPv6 off on it altogether.
    const hostEnd = [
      `link set ${iface} alias ${plan.sandboxId}${this.ipv6 ? " addrgenmode none" : ""}`,
      `addr add ${cidr(guest.gateway)} dev ${iface}`,
      `link set ${iface} up`,
    ];
    try {
      if (plan.kind === "veth") {
        const ns = netnsName(this.opts.tag, plan.sandboxId);
        await ipBatch([
          `netns add ${ns}`,
          `link add ${iface} type veth peer name eth0 netns ${ns}`,
          ...hostEnd,
          // `ip -batch` takes no per-line namespace: one child in the namespace configures it.
          `netns exec ${ns} sh -c '${this.ipv6 ? `${NS_IPV6_OFF} && ` : ""}${NS_CONFIGURE}' sh ${cidr(guest.guest)} ${guest.gateway}`,
        ]);
      } else {
        await ipBatch([`tuntap add dev ${iface} mode tap`, ...hostEnd]);
      }
      if (this.ipv6) await writeFile(`/proc/sys/net/ipv6/conf/${iface}/disable_ipv6`, "1\n");
      await nft(
        renderSandboxAdd({
          table: this.table,
          sandboxId: plan.sandboxId,
          iface,
          guest: guest.guest,
          policy: plan.policy,
        }),
      );
      this.made.set(plan.sandboxId, plan);
      this.opts.log("network_plumbed", {
        sandbox_id: plan.sandboxId,
        iface,
        guest: guest.guest,
        ms: Date.now() - started,
      });
    } catch (err) {
      throw new NetworkSetupError(`Could not set up the network of sandbox ${plan.sandboxId}.`, { cause: err });
    }
  }

  /**
   * Removes the sandbox's chain, interfaces and namespace, whichever exist, under this home's names
   * and under the untagged ones of an older bothy; safe to repeat.
   */
  async teardown(sandboxId: string): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId))
      throw new BothyError("invalid_sandbox_id", `Refusing to remove the network of ${sandboxId}: not a sandbox id.`);
    // What this server plumbed whole is known without listing anything: one nft and one ip. If that
    // fails (something of it is gone already), the full teardown finds what is left.
    const made = this.tables.length === 1 ? this.made.get(sandboxId) : undefined;
    const removed = made ? await succeeds(this.removeMade(made)) : false;
    if (!removed) await this.removeListed(sandboxId);
    this.made.delete(sandboxId);
    this.subnets.free(sandboxId);
    this.policies.delete(sandboxId);
  }

  /** Removes exactly what `plumb` made of a sandbox: its chain and set elements, its link and its namespace. */
  private async removeMade(plan: PlannedNetwork): Promise<void> {
    const gateway = plan.policy.gateway ? [{ iface: plan.iface, guest: plan.guest.guest }] : [];
    await nft(renderSandboxRemove(this.table, plan.sandboxId, [plan.iface], true, gateway));
    await ipBatch([
      `link del ${plan.iface}`,
      ...(plan.guest.netns ? [`netns del ${plan.guest.netns}`] : []),
      ...existingNamespaces([LEGACY.netnsName(plan.sandboxId)]).map((ns) => `netns del ${ns}`),
    ]);
  }

  /**
   * Finds the sandbox's objects on the host and removes them: after a crash, for a sandbox taken
   * over or whose plumb was cut short, and in a home an older bothy used.
   */
  private async removeListed(sandboxId: string): Promise<void> {
    const names = [ifaceName(this.opts.tag, sandboxId, "veth"), ifaceName(this.opts.tag, sandboxId, "tap")];
    for (const table of this.tables) {
      const rules = await listRules(table);
      if (!rules) continue;
      const keys = rules.elements.filter((e) => e.target === sandboxId).map((e) => e.key);
      const gateway = rules.gateway.filter((g) => names.includes(g.iface));
      const script = renderSandboxRemove(table, sandboxId, keys, rules.chains.includes(sandboxId), gateway);
      if (script) await nft(script);
    }
    // By alias: another sandbox whose name collides in its 8 id characters keeps its link. A link
    // of ours without an alias yet is one a plumb of this sandbox cut short.
    // Deleting the host end removes the veth pair at once; a deleted namespace frees its links later.
    // One `ip` for all of them (each spawn costs the server a fork); it stops at the first failure.
    const removals = [
      ...(await listLinks())
        .filter((link) => link.alias === sandboxId || (link.alias === undefined && names.includes(link.name)))
        .map((link) => `link del ${link.name}`),
      ...existingNamespaces([netnsName(this.opts.tag, sandboxId), LEGACY.netnsName(sandboxId)]).map(
        (ns) => `netns del ${ns}`,
      ),
    ];
    if (removals.length > 0) await ipBatch(removals);
  }

  /**
   * At a clean stop: removes this home's table once no sandbox has rules in it (a paused VM keeps
   * its chain, and with it the table), so a home no longer used leaves nothing on the host.
   */
  async close(): Promise<void> {
    const rules = await listRules(this.table);
    if (
      rules &&
      !rules.chains.some((c) => SANDBOX_ID_RE.test(c)) &&
      rules.elements.length === 0 &&
      rules.gateway.length === 0
    )
      await nft(`delete table ${this.table}\n`);
  }

  /**
   * Every network object of a sandbox of this home: namespaces, interfaces, chains with its tag,
   * and those under the untagged names whose sandbox has its directory in this home.
   */
  async reconcile(): Promise<HostObject[]> {
    const found: HostObject[] = [];
    for (const name of await readdir(NETNS_DIR).catch(() => [] as string[])) {
      const id = `sbx_${this.netnsRe.exec(name)?.[1] ?? LEGACY.netnsRe.exec(name)?.[1] ?? ""}`;
      if (SANDBOX_ID_RE.test(id) && (this.netnsRe.test(name) || this.hasSandboxDir(id)))
        found.push({ sandboxId: id, kind: "netns", description: `network namespace ${name}` });
    }
    for (const link of await listLinks()) {
      if (link.alias && this.isOwnLink(link))
        found.push({ sandboxId: link.alias, kind: "interface", description: `interface ${link.name}` });
    }
    for (const table of this.tables) {
      const rules = await listRules(table);
      if (!rules) continue;
      const ours = (id: string): boolean => SANDBOX_ID_RE.test(id) && (table === this.table || this.hasSandboxDir(id));
      for (const chain of rules.chains.filter(ours))
        found.push({ sandboxId: chain, kind: "nft-chain", description: `nft chain ${table} ${chain}` });
      for (const e of rules.elements)
        if (ours(e.target) && !rules.chains.includes(e.target))
          found.push({
            sandboxId: e.target,
            kind: "nft-map-element",
            description: `nft map element ${table} ${e.key}`,
          });
    }
    return found;
  }
}

/** Whether the promise fulfils; its rejection is the caller's cue to take another way. */
function succeeds(p: Promise<unknown>): Promise<boolean> {
  return p.then(
    () => true,
    () => false,
  );
}
