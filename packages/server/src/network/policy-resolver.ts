/**
 * The resolver a sandbox under the egress gateway asks: nft redirects its UDP port 53, whatever
 * resolver it names, to this socket on the host end of its link (nft-ruleset.ts). It answers a
 * name only when the sandbox's host policy could let HTTP(S) to it out, from BOTHY_DNS, and
 * answers REFUSED for the rest without asking anyone: with `internet: false` the names its
 * `allow_hosts` permit resolve, and no other name, so no lookup carries data out.
 */
import { createSocket, type RemoteInfo, type Socket } from "node:dgram";
import { once } from "node:events";
import { Resolver } from "node:dns/promises";
import { isIPv4 } from "node:net";
import { decide, hostMatches } from "../gateway/host-policy.ts";
import type { GatewaySandbox } from "../gateway/contracts.ts";
import type { SandboxLookup } from "../gateway/gateway-lookup.ts";
import { answer, formatError, isInternetClass, parseQuery, QTYPE_A, RCODE, type DnsQuery } from "./dns-message.ts";

const RESOLVE_TIMEOUT_MS = 3_000;
/** Lookups under way at once, in all and per sandbox; a query past either gets no answer (the stub retries). */
const MAX_INFLIGHT = 256;
const MAX_INFLIGHT_PER_SANDBOX = 32;
const CACHE_ENTRIES = 4096;
const CACHE_MAX_S = 60;
/** The most A records one answer carries: with the question it stays far below 512 bytes. */
const MAX_ANSWERS = 16;

/**
 * Whether a name of this sandbox's is looked up: a rule other than `deny` names it, or, with the
 * internet on, the policy's first word on it is not `deny`. A rule with methods or a path counts
 * (HTTP(S) to the host may pass it), a `deny` rule that comes first does not.
 */
export function resolvable(sb: Pick<GatewaySandbox, "policy" | "internet">, name: string): boolean {
  const first = decide(sb.policy, { host: name, method: null, path: null });
  if (first.action === "deny" && first.rule !== "default") return false;
  if (sb.policy.rules.some((r) => r.action !== "deny" && hostMatches(r.host, name))) return true;
  return sb.internet !== false && first.action !== "deny";
}

export interface PolicyResolverOptions {
  /** BOTHY_DNS: where permitted names are looked up. */
  dns: string[];
  /** Where to listen; default all addresses (nft delivers only redirected queries from sandboxes). */
  host?: string;
}

export class PolicyResolver {
  private socket: Socket | undefined;
  private lookup: SandboxLookup | undefined;
  private readonly resolver = new Resolver({ timeout: RESOLVE_TIMEOUT_MS, tries: 2 });
  private readonly cache = new Map<string, { addresses: string[]; until: number }>();
  private inflight = 0;
  private readonly inflightBy = new Map<string, number>();

  constructor(private readonly opts: PolicyResolverOptions) {
    this.resolver.setServers(opts.dns);
  }

  /** Binds the UDP socket on a free port and answers that port. */
  async listen(): Promise<number> {
    const socket = createSocket({ type: "udp4" });
    socket.on("message", (msg, from) => this.onQuery(msg, from));
    // A send to a sandbox that has gone fails with the socket still usable.
    socket.on("error", () => undefined);
    socket.bind(0, this.opts.host ?? "0.0.0.0");
    await once(socket, "listening");
    this.socket = socket;
    return socket.address().port;
  }

  /** Who is behind a source address; until then every query goes unanswered. */
  attach(lookup: SandboxLookup): void {
    this.lookup = lookup;
  }

  async close(): Promise<void> {
    const socket = this.socket;
    this.socket = undefined;
    this.resolver.cancel();
    if (socket) await new Promise<void>((resolve) => socket.close(() => resolve()));
  }

  private onQuery(msg: Buffer, from: RemoteInfo): void {
    const lookup = this.lookup?.sandboxOf(from.address);
    if (!lookup) return;
    lookup.then((sb) => this.onSandboxQuery(msg, from, sb)).catch(() => undefined);
  }

  private onSandboxQuery(msg: Buffer, from: RemoteInfo, sb: GatewaySandbox | undefined): void {
    if (!sb) return;
    const q = parseQuery(msg);
    if (!q) {
      const err = formatError(msg);
      if (err) this.send(err, from);
      return;
    }
    if (!isInternetClass(q) || !resolvable(sb, q.name)) return this.send(answer(q, RCODE.refused), from);
    // Sandboxes have no IPv6: a permitted name has no other records for them.
    if (q.type !== QTYPE_A) return this.send(answer(q, RCODE.noError), from);
    const mine = this.inflightBy.get(sb.sandboxId) ?? 0;
    if (this.inflight >= MAX_INFLIGHT || mine >= MAX_INFLIGHT_PER_SANDBOX) return;
    this.inflight++;
    this.inflightBy.set(sb.sandboxId, mine + 1);
    this.answerA(q)
      .then((reply) => this.send(reply, from))
      .finally(() => {
        this.inflight--;
        const left = (this.inflightBy.get(sb.sandboxId) ?? 1) - 1;
        if (left === 0) this.inflightBy.delete(sb.sandboxId);
        else this.inflightBy.set(sb.sandboxId, left);
      });
  }

  private async answerA(q: DnsQuery): Promise<Buffer> {
    if (isIPv4(q.name)) return answer(q, RCODE.noError, [q.name]);
    const cached = this.cache.get(q.name);
    if (cached && cached.until > Date.now())
      return answer(q, RCODE.noError, cached.addresses, Math.ceil((cached.until - Date.now()) / 1000));
    try {
      const records = (await this.resolver.resolve4(q.name, { ttl: true })).slice(0, MAX_ANSWERS);
      const ttl = Math.min(CACHE_MAX_S, ...records.map((r) => r.ttl));
      const addresses = records.map((r) => r.address);
      if (this.cache.size >= CACHE_ENTRIES) this.cache.clear();
      if (ttl > 0) this.cache.set(q.name, { addresses, until: Date.now() + ttl * 1000 });
      return answer(q, RCODE.noError, addresses, Math.max(0, ttl));
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "ENOTFOUND") return answer(q, RCODE.nxDomain);
      if (code === "ENODATA") return answer(q, RCODE.noError);
      return answer(q, RCODE.servFail);
    }
  }

  private send(reply: Buffer, to: RemoteInfo): void {
    this.socket?.send(reply, to.port, to.address);
  }
}
