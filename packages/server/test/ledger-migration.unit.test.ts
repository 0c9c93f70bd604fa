/**
 * A ledger made before tenants (schema 9, today's release) migrates with nothing lost: every
 * sandbox, command, event, idempotency key and usage row belongs to the `default` tenant after.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { DEFAULT_TENANT, Ledger, MIGRATIONS } from "../src/ledger/ledger.ts";

const BEFORE_TENANTS = 9;
let dir: string | undefined;

afterEach(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
  dir = undefined;
});

/** A ledger as the release before tenants left it, with one of each kind of row. */
function oldLedger(path: string): void {
  const db = new Database(path);
  for (const step of MIGRATIONS.slice(0, BEFORE_TENANTS)) db.exec(step);
  db.pragma(`user_version = ${BEFORE_TENANTS}`);
  const t = "2026-11-30T10:00:00.000Z";
  db.prepare(
    `INSERT INTO sandboxes (id, template, template_hash, driver, vcpu, memory_mib, state, created_at, updated_at, metadata, disk_mib, max_processes)
     VALUES ('sbx_aaaaaaaaaaaaaaaaaaaa', 'seed', 'h', 'gvisor', 1, 512, 'running', ?, ?, '{"team":"x"}', 4096, 1024)`,
  ).run(t, t);
  db.prepare(
    `INSERT INTO sandboxes (id, template, template_hash, driver, vcpu, memory_mib, state, created_at, updated_at, deleted_at)
     VALUES ('sbx_bbbbbbbbbbbbbbbbbbbb', 'seed', 'h', 'gvisor', 1, 512, 'deleted', ?, ?, ?)`,
  ).run(t, t, t);
  db.prepare(
    `INSERT INTO commands (id, sandbox_id, cmd, state, exit_code, started_at, ended_at) VALUES ('cmd_aaaaaaaaaaaaaaaaaaaa', 'sbx_aaaaaaaaaaaaaaaaaaaa', 'echo', 'exited', 0, ?, ?)`,
  ).run(t, t);
  db.prepare(
    `INSERT INTO idempotency_keys (key, fingerprint, sandbox_id, created_at) VALUES ('k1', 'fp', 'sbx_aaaaaaaaaaaaaaaaaaaa', ?)`,
  ).run(t);
  db.prepare(
    `INSERT INTO events (type, sandbox_id, data, created_at) VALUES ('sandbox.created', 'sbx_aaaaaaaaaaaaaaaaaaaa', '{}', ?)`,
  ).run(t);
  db.prepare(
    `INSERT INTO usage_sandbox (sandbox_id, owner, vcpu_seconds, gib_seconds) VALUES ('sbx_aaaaaaaaaaaaaaaaaaaa', 'default', 3600, 1800)`,
  ).run();
  db.prepare(
    `INSERT INTO usage_owner (owner, month, vcpu_seconds, gib_seconds) VALUES ('default', '2026-11', 3600, 1800)`,
  ).run();
  db.close();
}

describe("ledger migration to tenants", () => {
  it("moves every row of a ledger made before tenants to the default tenant", async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-ledger-"));
    const path = join(dir, "ledger.sqlite");
    oldLedger(path);
    const ledger = new Ledger(path);
    try {
      const rows = ledger.listSandboxes({ includeDeleted: true });
      expect(rows.map((r) => [r.id, r.tenant, r.state])).toEqual([
        ["sbx_aaaaaaaaaaaaaaaaaaaa", DEFAULT_TENANT, "running"],
        ["sbx_bbbbbbbbbbbbbbbbbbbb", DEFAULT_TENANT, "deleted"],
      ]);
      expect(rows[0]?.metadata).toBe('{"team":"x"}');
      expect(ledger.getCommand("cmd_aaaaaaaaaaaaaaaaaaaa")).toMatchObject({ exit_code: 0 });
      expect(ledger.findIdempotencyKey(DEFAULT_TENANT, "k1")).toEqual({
        fingerprint: "fp",
        sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa",
      });
      expect(ledger.findIdempotencyKey("other", "k1")).toBeUndefined();
      expect(ledger.eventsSince(0).map((e) => [e.type, e.tenant])).toEqual([["sandbox.created", DEFAULT_TENANT]]);
      expect(ledger.ownerUsage("2026-11")).toMatchObject([{ owner: DEFAULT_TENANT, vcpu_seconds: 3600 }]);
      expect(ledger.auth.tenants().map((t) => t.id)).toEqual([DEFAULT_TENANT]);
      expect(ledger.auth.countKeys()).toBe(0);
      expect(ledger.auth.sandboxIdsOf(DEFAULT_TENANT).size).toBe(2);
      // New rows take their sandbox's tenant.
      ledger.insertCommand({ id: "cmd_bbbbbbbbbbbbbbbbbbbb", sandbox_id: "sbx_aaaaaaaaaaaaaaaaaaaa", cmd: "ls" });
      expect(ledger.insertEvent("command.exited", "sbx_aaaaaaaaaaaaaaaaaaaa", {}).tenant).toBe(DEFAULT_TENANT);
      expect(ledger.insertEvent("budget.exceeded", null, {}).tenant).toBeNull();
    } finally {
      ledger.close();
    }
    // Opening it again runs nothing twice.
    new Ledger(path).close();
  });
});
