/**
 * The network tests' own little world, which never touches the real network: a namespace `host`
 * where the bothy server runs, whose only uplink is a veth to a namespace `wan` that plays the
 * internet (HTTP at 203.0.113.10, DNS at 198.51.100.53), a namespace `lan` with private hosts at
 * 10.200.0.10 and .11, and a control veth from the test's own namespace to `host` for the API.
 * `wan` has no route anywhere else. Everything is named with a random tag and removed by `destroy`.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { testKernelDir, testTemplatesDir } from "../../../../test/paths.ts";
import { watchServe, type ServeProcess } from "./serve-process.ts";

const pexec = promisify(execFile);
const FIXTURE = fileURLToPath(new URL("../fixtures/net-fixture.mjs", import.meta.url));
const BOTHY = fileURLToPath(new URL("../../../cli/bin/bothy.js", import.meta.url));

export const PUBLIC_HTTP = "203.0.113.10";
export const PUBLIC_DNS = "198.51.100.53";
export const PRIVATE_HOST = "10.200.0.10";
export const PRIVATE_HOST_2 = "10.200.0.11";
export const HOST_UPLINK_ADDR = "198.18.0.2";
export const HOST_LAN_ADDR = "10.200.0.1";
/** A port every host address listens on (from a fixture in `host`), so a refusal means the filter. */
export const HOST_PORT = 8099;
export const TEST_NAME = "probe.bothy.test";
export const TEST_ANSWER = "203.0.113.77";
/** Names the `wan` resolver answers: the HTTP(S) echo host under several names, and one private address. */
export const NAMES = {
  api: "api.bothy.test",
  other: "other.bothy.test",
  svcApex: "svc.bothy.test",
  svcSub: "a.svc.bothy.test",
  private: "private.bothy.test",
} as const;
const RECORDS: Record<string, string> = {
  [NAMES.api]: PUBLIC_HTTP,
  [NAMES.other]: PUBLIC_HTTP,
  [NAMES.svcApex]: PUBLIC_HTTP,
  [NAMES.svcSub]: PUBLIC_HTTP,
  [NAMES.private]: PRIVATE_HOST,
};

export async function sh(file: string, args: string[], input?: string): Promise<string> {
  if (input === undefined) return (await pexec(file, args)).stdout;
  return new Promise((resolve, reject) => {
    const child = execFile(file, args, (err, stdout) => (err ? reject(err) : resolve(stdout)));
    child.stdin?.end(input);
  });
}

export class NetTopology {
  readonly tag = randomBytes(3).toString("hex");
  readonly host = `bnt${this.tag}-host`;
  readonly wan = `bnt${this.tag}-wan`;
  readonly lan = `bnt${this.tag}-lan`;
  /** The test side of the control link, and the server's side of it (the API listens there). */
  readonly ctlIf = `bnt${this.tag}c0`;
  readonly ctlHostAddr: string;
  private readonly ctlTestAddr: string;
  private readonly children: ChildProcess[] = [];
  private certDir = "";
  /** The test CA that signed the `wan` HTTPS server's certificate (for *.bothy.test and its address). */
  caPem = "";

  /** `logWanRequests`: the `wan` fixture logs each request it parses (see `wanRequests`); off for benches. */
  constructor(private readonly opts: { logWanRequests?: boolean } = {}) {
    // A /30 in 10.252/16 chosen by the tag, so two runs on one machine do not collide.
    const n = (parseInt(this.tag, 16) % 16000) * 4;
    this.ctlTestAddr = `10.252.${Math.floor(n / 256)}.${(n % 256) + 1}`;
    this.ctlHostAddr = `10.252.${Math.floor(n / 256)}.${(n % 256) + 2}`;
  }

  get netnsPath(): string {
    return `/run/netns/${this.host}`;
  }

  async create(): Promise<void> {
    const t = this.tag;
    for (const ns of [this.host, this.wan, this.lan]) {
      await sh("ip", ["netns", "add", ns]);
      await sh("ip", ["-n", ns, "link", "set", "lo", "up"]);
    }
    // host <-> wan: the only uplink.
    await veth([`bnt${t}u0`, this.host], [`bnt${t}u1`, this.wan]);
    await batch(this.host, [
      `addr add ${HOST_UPLINK_ADDR}/24 dev bnt${t}u0`,
      `link set bnt${t}u0 up`,
      "route add default via 198.18.0.1",
    ]);
    await batch(this.wan, [
      `addr add 198.18.0.1/24 dev bnt${t}u1`,
      `link set bnt${t}u1 up`,
      `addr add ${PUBLIC_HTTP}/32 dev lo`,
      `addr add ${PUBLIC_DNS}/32 dev lo`,
    ]);
    // host <-> lan: private hosts behind the server's host.
    await veth([`bnt${t}l0`, this.host], [`bnt${t}l1`, this.lan]);
    await batch(this.host, [`addr add ${HOST_LAN_ADDR}/24 dev bnt${t}l0`, `link set bnt${t}l0 up`]);
    await batch(this.lan, [
      `addr add ${PRIVATE_HOST}/24 dev bnt${t}l1`,
      `addr add ${PRIVATE_HOST_2}/24 dev bnt${t}l1`,
      `link set bnt${t}l1 up`,
      `route add default via ${HOST_LAN_ADDR}`,
    ]);
    // test <-> host: the API.
    await veth([this.ctlIf], [`bnt${t}c1`, this.host]);
    await sh("ip", ["addr", "add", `${this.ctlTestAddr}/30`, "dev", this.ctlIf]);
    await sh("ip", ["link", "set", this.ctlIf, "up"]);
    await batch(this.host, [`addr add ${this.ctlHostAddr}/30 dev bnt${t}c1`, `link set bnt${t}c1 up`]);

    await this.makeCertificates();
    await this.fixture(this.wan, [
      "--name",
      "wan",
      "--http",
      `${PUBLIC_HTTP}:80`,
      "--https",
      `${PUBLIC_HTTP}:443`,
      "--cert",
      join(this.certDir, "leaf.pem"),
      "--key",
      join(this.certDir, "leaf.key"),
      "--dns",
      `${PUBLIC_DNS}:53`,
      ...(this.opts.logWanRequests ? ["--log", this.wanLogFile] : []),
      ...Object.entries(RECORDS).flatMap(([name, addr]) => ["--record", `${name}=${addr}`]),
    ]);
    await this.fixture(this.lan, ["--name", "lan", "--http", `0.0.0.0:80`, "--dns", `${PRIVATE_HOST}:53`]);
    // A resolver and a listener on the host's own addresses: sandboxes must reach neither.
    await this.fixture(this.host, [
      "--name",
      "host",
      "--http",
      `0.0.0.0:${HOST_PORT}`,
      "--dns",
      `${HOST_UPLINK_ADDR}:53`,
      "--dns",
      `${HOST_LAN_ADDR}:53`,
    ]);
  }

  /** A test CA and a leaf it signed for the `wan` HTTPS server, made with openssl in a directory of ours. */
  private async makeCertificates(): Promise<void> {
    this.certDir = await mkdtemp(join(tmpdir(), "bothy-net-ca-"));
    const f = (name: string): string => join(this.certDir, name);
    const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    await sh("openssl", [
      "req",
      "-x509",
      ...ec,
      "-keyout",
      f("ca.key"),
      "-out",
      f("ca.pem"),
      "-days",
      "2",
      "-subj",
      "/CN=bothy test CA",
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign",
    ]);
    await sh("openssl", ["req", ...ec, "-keyout", f("leaf.key"), "-out", f("leaf.csr"), "-subj", "/CN=api.bothy.test"]);
    await writeFile(
      f("ext.cnf"),
      `subjectAltName=DNS:*.bothy.test,DNS:bothy.test,DNS:*.svc.bothy.test,IP:${PUBLIC_HTTP}\nextendedKeyUsage=serverAuth\n`,
    );
    await sh("openssl", [
      "x509",
      "-req",
      "-in",
      f("leaf.csr"),
      "-CA",
      f("ca.pem"),
      "-CAkey",
      f("ca.key"),
      "-CAcreateserial",
      "-out",
      f("leaf.pem"),
      "-days",
      "2",
      "-extfile",
      f("ext.cnf"),
    ]);
    this.caPem = await readFile(f("ca.pem"), "utf8");
  }

  /** Where the `wan` fixture logs every request its HTTP(S) servers parse. */
  get wanLogFile(): string {
    return join(this.certDir, "wan-requests.jsonl");
  }

  /**
   * Every request the `wan` servers parsed so far, in order of their heads; `body` is what arrived
   * of it by the end of the body ("" while a body has not ended).
   */
  async wanRequests(): Promise<Array<{ method: string; url: string; host: string | null; body: string }>> {
    const text = await readFile(this.wanLogFile, "utf8").catch(() => "");
    const byId = new Map<number, { method: string; url: string; host: string | null; body: string }>();
    for (const line of text.split("\n").filter((l) => l.length > 0)) {
      const e = JSON.parse(line) as { id: number; method?: string; url?: string; host?: string | null; body?: string };
      const seen = byId.get(e.id);
      if (seen) seen.body = e.body ?? "";
      else byId.set(e.id, { method: e.method ?? "", url: e.url ?? "", host: e.host ?? null, body: "" });
    }
    return [...byId.values()];
  }

  /** The test CA's file, for a server's NODE_EXTRA_CA_CERTS. */
  get caFile(): string {
    return join(this.certDir, "ca.pem");
  }

  /** Starts a fixture server in a namespace and waits until it listens. */
  private async fixture(ns: string, args: string[]): Promise<void> {
    const child = spawn("ip", ["netns", "exec", ns, process.execPath, FIXTURE, ...args], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    this.children.push(child);
    await new Promise<void>((resolve, reject) => {
      child.once("exit", (code) => reject(new Error(`fixture in ${ns} exited (${code})`)));
      createInterface({ input: child.stdout! }).on("line", (l) => l === "ready" && resolve());
    });
  }

  /** Spawns a process inside the `host` namespace (network only: the mount namespace stays ours). */
  spawnInHost(
    file: string,
    args: string[],
    env: NodeJS.ProcessEnv,
    stderr: "inherit" | "pipe" = "inherit",
  ): ChildProcess {
    return spawn("nsenter", [`--net=${this.netnsPath}`, "--", file, ...args], {
      env,
      stdio: ["ignore", "pipe", stderr],
    });
  }

  /**
   * Starts the real `bothy serve` in the `host` namespace with the shared test caches, listening
   * on the control link; `env` adds to or overrides that (networking is on unless it says off);
   * `nodeArgs` go to Node before the CLI (bench/ports' `--cpu-prof`).
   */
  serveInHost(home: string, env: Record<string, string> = {}, nodeArgs: string[] = []): ServeProcess {
    return watchServe(this.spawnInHost(process.execPath, [...nodeArgs, BOTHY, "serve"], this.serveEnv(home, env)));
  }

  /** Starts `bothy serve` as `serveInHost` does, for a start that must fail: its exit code and what it printed. */
  async serveFailure(home: string, env: Record<string, string> = {}): Promise<{ code: number | null; stderr: string }> {
    const child = this.spawnInHost(process.execPath, [BOTHY, "serve"], this.serveEnv(home, env), "pipe");
    let stderr = "";
    child.stderr?.on("data", (d: Buffer) => (stderr += d.toString()));
    const closed = new Promise<number | null>((r) => child.once("close", (c) => r(c)));
    // A server that starts after all is stopped at once (its clean exit fails the caller's check).
    watchServe(child).url.then(
      () => child.kill("SIGTERM"),
      () => undefined,
    );
    return { code: await closed, stderr };
  }

  private serveEnv(home: string, env: Record<string, string>): NodeJS.ProcessEnv {
    return {
      ...process.env,
      BOTHY_HOME: home,
      BOTHY_TEMPLATES_DIR: testTemplatesDir(),
      BOTHY_KERNEL_DIR: testKernelDir(),
      BOTHY_HOST: this.ctlHostAddr,
      // The control link is a veth pair this test made: plain HTTP is fine there.
      BOTHY_INSECURE_HTTP: "1",
      BOTHY_PORT: "0",
      BOTHY_POOL_SIZE: "0",
      BOTHY_NETWORK: "on",
      BOTHY_DNS: PUBLIC_DNS,
      ...env,
    };
  }

  /** Runs a command in the `host` namespace and returns its stdout. */
  inHost(file: string, args: string[]): Promise<string> {
    return sh("nsenter", [`--net=${this.netnsPath}`, "--", file, ...args]);
  }

  /**
   * What bothy's network objects still exist: namespaces, interfaces (in `host`) and chains and map
   * elements of its tables; of the home with that tag (util/host-names.ts), or of any home.
   */
  async bothyObjects(
    tag?: string,
  ): Promise<{ netns: string[]; links: string[]; chains: string[]; mapElements: number }> {
    const t = tag ?? "[a-z2-7]{4}";
    const netns = (await sh("ip", ["netns", "list"]))
      .split("\n")
      .map((l) => l.split(" ")[0] ?? "")
      .filter((n) => new RegExp(`^bothy-${t}-`).test(n) || (!tag && /^bothy-[a-z2-7]{20}$/.test(n)));
    const links = (JSON.parse(await this.inHost("ip", ["-j", "link", "show"])) as Array<{ ifname: string }>)
      .map((l) => l.ifname)
      .filter((n) => new RegExp(`^b[vts]${t}-`).test(n) || (!tag && /^b[vt]-/.test(n)));
    const tables = (
      JSON.parse(await this.inHost("nft", ["-j", "list", "tables"])) as {
        nftables: Array<{ table?: { family: string; name: string } }>;
      }
    ).nftables
      .flatMap((i) => (i.table?.family === "inet" ? [i.table.name] : []))
      .filter((n) => (tag ? n === `bothy-${tag}` : /^bothy(-[a-z2-7]{4})?$/.test(n)));
    const chains: string[] = [];
    let mapElements = 0;
    for (const table of tables) {
      const items = (
        JSON.parse(await this.inHost("nft", ["-j", "list", "table", "inet", table])) as {
          nftables: Array<Record<string, { name?: string; elem?: unknown[] }>>;
        }
      ).nftables;
      chains.push(...items.flatMap((i) => (i["chain"]?.name?.startsWith("sbx_") ? [i["chain"].name] : [])));
      // The egress map's elements and the gateway set's (a sandbox under the egress gateway).
      mapElements += items.reduce((n, i) => n + (i["map"]?.elem?.length ?? 0) + (i["set"]?.elem?.length ?? 0), 0);
    }
    return { netns, links, chains, mapElements };
  }

  /** Kills the fixtures (by pid) and removes every namespace and link this topology made. */
  async destroy(): Promise<void> {
    for (const c of this.children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
    // Interfaces in the host namespace go with it; bothy's own leftovers are reported by the test.
    await sh("ip", ["link", "del", this.ctlIf]).catch(() => undefined);
    for (const ns of [this.host, this.wan, this.lan]) await sh("ip", ["netns", "del", ns]).catch(() => undefined);
    if (this.certDir) await rm(this.certDir, { recursive: true, force: true });
  }
}

/** A veth pair, each end named and put in its namespace (or left in the test's own). */
function veth([a, aNs]: [string, string?], [b, bNs]: [string, string?]): Promise<string> {
  const where = (ns?: string): string[] => (ns === undefined ? [] : ["netns", ns]);
  return sh("ip", ["link", "add", a, ...where(aNs), "type", "veth", "peer", "name", b, ...where(bNs)]);
}

function batch(ns: string, lines: string[]): Promise<string> {
  return sh("ip", ["-n", ns, "-batch", "-"], lines.join("\n") + "\n");
}
