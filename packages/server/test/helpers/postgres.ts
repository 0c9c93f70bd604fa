import { execFile, spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { chown, mkdtemp, readdir, readFile, rm, stat } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import pg from "pg";

const run = promisify(execFile);

/** Debian's PostgreSQL 15 (`scripts/install-deps`); its binaries are not on PATH. */
const BIN = "/usr/lib/postgresql/15/bin";
/** initdb and postgres refuse to run as root: they run as Debian's `postgres` system user. */
const USER = "postgres";

export interface TestPostgres {
  /** `postgres://postgres@127.0.0.1:PORT/postgres`: a connection string as BOTHY_DATABASE_URL takes it. */
  readonly url: string;
  /** The postmaster's pid (the process this helper started, and the only one it signals). */
  readonly pid: number;
  /**
   * A fresh, empty database of this server, named `name`; its URL. Its collation is ICU's en-US, as
   * a database made with a usual locale sorts text: linguistically, not by bytes.
   */
  createDatabase(name: string): Promise<string>;
  /** Stops the server (fast shutdown), waits for it to exit and removes its directory. */
  stop(): Promise<void>;
}

/**
 * As the postgres user; and should the test's process die without stopping it (a worker killed at a
 * timeout), the kernel asks postgres for a fast shutdown (`--pdeathsig`, set after the user change,
 * which would clear it).
 */
function asPostgres(args: string[]): [string, string[]] {
  return ["setpriv", ["--reuid", USER, "--regid", USER, "--init-groups", "--pdeathsig", "INT", "--", ...args]];
}

/**
 * Removes the directories of earlier runs whose server is gone (a test process killed before its
 * `stop`): those with no live postmaster and untouched for ten minutes, so a server another test
 * file is starting right now is never one of them.
 */
async function removeStale(): Promise<void> {
  const cutoff = Date.now() - 10 * 60_000;
  for (const name of await readdir(tmpdir())) {
    if (!name.startsWith("bothy-pg-")) continue;
    const dir = join(tmpdir(), name);
    const pid = Number((await readFile(join(dir, "data", "postmaster.pid"), "utf8").catch(() => "")).split("\n")[0]);
    if (pid > 0 && alive(pid)) continue;
    const { mtimeMs } = await stat(dir).catch(() => ({ mtimeMs: Date.now() }));
    if (mtimeMs < cutoff) await rm(dir, { recursive: true, force: true });
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** A loopback port free now (another process may take it before its user binds it: retry then). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no loopback port");
  return address.port;
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

/**
 * A PostgreSQL server of the test's own: `initdb` in a temp directory, `postgres` listening on a
 * unix socket in that directory and on a free loopback port, durability off (a test's data need not
 * survive a power cut) unless `durable` (a benchmark against SQLite's synced writes). Collation C,
 * as bothy's text columns compare bytes in both stores.
 */
export async function startPostgres(options: { durable?: boolean } = {}): Promise<TestPostgres> {
  if (!existsSync(join(BIN, "postgres")))
    throw new Error(`PostgreSQL 15 is not installed (no ${BIN}/postgres): run scripts/install-deps as root.`);
  await removeStale();
  const dir = await mkdtemp(join(tmpdir(), "bothy-pg-"));
  const data = join(dir, "data");
  let child: ChildProcess | undefined;
  const log: string[] = [];
  const cleanup = async (): Promise<void> => {
    if (child && child.exitCode === null && child.signalCode === null) {
      const gone = exited(child);
      child.kill("SIGINT");
      await gone;
    }
    await rm(dir, { recursive: true, force: true });
  };
  try {
    await chown(dir, ...(await idsOf(USER)));
    const [cmd, args] = asPostgres([
      join(BIN, "initdb"),
      "-D",
      data,
      "-A",
      "trust",
      "-U",
      USER,
      "--locale=C",
      "-E",
      "UTF8",
      "--no-sync",
    ]);
    await run(cmd, args);
    // A port found free may be taken before postgres binds it (tests of other files run at once): retry.
    for (let attempt = 0; ; attempt++) {
      const port = await freePort();
      const [pcmd, pargs] = asPostgres([
        join(BIN, "postgres"),
        "-D",
        data,
        "-k",
        dir,
        "-p",
        String(port),
        "-c",
        "listen_addresses=127.0.0.1",
        ...(options.durable ? [] : ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]),
      ]);
      const started = spawn(pcmd, pargs, { stdio: ["ignore", "ignore", "pipe"] });
      child = started;
      started.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
        log.push(chunk);
        if (log.length > 200) log.shift();
      });
      const url = `postgres://${USER}@127.0.0.1:${port}/postgres`;
      if (await ready(url, started)) {
        const pid = started.pid ?? 0;
        return {
          url,
          pid,
          async createDatabase(name) {
            const client = new pg.Client({ connectionString: url });
            await client.connect();
            try {
              await client.query(
                `CREATE DATABASE ${pg.escapeIdentifier(name)} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'`,
              );
            } finally {
              await client.end();
            }
            return `postgres://${USER}@127.0.0.1:${port}/${encodeURIComponent(name)}`;
          },
          stop: cleanup,
        };
      }
      await exited(started);
      if (attempt >= 4) throw new Error(`postgres did not start:\n${log.join("")}`);
    }
  } catch (err) {
    await cleanup();
    throw err;
  }
}

async function idsOf(user: string): Promise<[number, number]> {
  const uid = Number((await run("id", ["-u", user])).stdout.trim());
  const gid = Number((await run("id", ["-g", user])).stdout.trim());
  return [uid, gid];
}

/** Polls until the server answers a query (true) or its process has exited (false); 30 s at most. */
async function ready(url: string, child: ChildProcess): Promise<boolean> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) return false;
    const client = new pg.Client({ connectionString: url });
    client.on("error", () => undefined);
    try {
      await client.connect();
      await client.query("SELECT 1");
      return true;
    } catch {
      await new Promise((resolve) => setTimeout(resolve, 50));
    } finally {
      await client.end().catch(() => undefined);
    }
  }
  throw new Error("postgres did not answer within 30 s");
}
