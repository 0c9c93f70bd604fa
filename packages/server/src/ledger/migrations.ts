/**
 * Schema steps in order, in SQLite's spelling (`dialect.ts` turns each into PostgreSQL's). SQLite
 * records how many have run in `PRAGMA user_version`, PostgreSQL in the table `bothy_schema`.
 */
export const MIGRATIONS = [
  `CREATE TABLE sandboxes (
     id TEXT PRIMARY KEY,
     template TEXT NOT NULL,
     template_hash TEXT NOT NULL,
     driver TEXT NOT NULL,
     vcpu INTEGER NOT NULL,
     memory_mib INTEGER NOT NULL,
     state TEXT NOT NULL,
     created_at TEXT NOT NULL,
     updated_at TEXT NOT NULL,
     deleted_at TEXT,
     error TEXT
   );
   CREATE INDEX sandboxes_state ON sandboxes(state);
   CREATE TABLE commands (
     id TEXT PRIMARY KEY,
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     cmd TEXT NOT NULL,
     state TEXT NOT NULL,
     exit_code INTEGER,
     signal TEXT,
     started_at TEXT NOT NULL,
     ended_at TEXT
   );
   CREATE INDEX commands_sandbox ON commands(sandbox_id);
   CREATE TABLE idempotency_keys (
     key TEXT PRIMARY KEY,
     fingerprint TEXT NOT NULL,
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     created_at TEXT NOT NULL
   );`,
  `ALTER TABLE commands ADD COLUMN background INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE commands ADD COLUMN timed_out INTEGER NOT NULL DEFAULT 0;
   CREATE TABLE events (
     seq INTEGER PRIMARY KEY AUTOINCREMENT,
     type TEXT NOT NULL,
     sandbox_id TEXT,
     data TEXT NOT NULL,
     created_at TEXT NOT NULL
   );
   CREATE INDEX events_sandbox ON events(sandbox_id, seq);`,
  // 3: which acceleration a sandbox's driver used (ptrace, kvm, tcg); rows before it have none.
  `ALTER TABLE sandboxes ADD COLUMN acceleration TEXT;`,
  // 4: lifetime: when the sweeper deletes it, and whether a dropped client deletes it sooner.
  `ALTER TABLE sandboxes ADD COLUMN expires_at TEXT;
   ALTER TABLE sandboxes ADD COLUMN delete_on_disconnect INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE sandboxes ADD COLUMN disconnect_grace_s INTEGER;
   CREATE INDEX sandboxes_expires ON sandboxes(expires_at) WHERE expires_at IS NOT NULL;`,
  // 5: the sandbox's effective network policy (JSON of protocol's networkPolicy); null before it.
  `ALTER TABLE sandboxes ADD COLUMN network TEXT;`,
  `ALTER TABLE sandboxes ADD COLUMN metadata TEXT;`,
  `CREATE TABLE usage_sandbox (
     sandbox_id TEXT PRIMARY KEY,
     owner TEXT NOT NULL,
     vcpu_seconds REAL NOT NULL DEFAULT 0,
     gib_seconds REAL NOT NULL DEFAULT 0
   );
   CREATE TABLE usage_owner (
     owner TEXT NOT NULL,
     month TEXT NOT NULL,
     vcpu_seconds REAL NOT NULL DEFAULT 0,
     gib_seconds REAL NOT NULL DEFAULT 0,
     warned TEXT NOT NULL DEFAULT '',
     PRIMARY KEY (owner, month)
   );`,
  // 8: the sandbox's disk size in MiB; null before it.
  `ALTER TABLE sandboxes ADD COLUMN disk_mib INTEGER;`,
  // 9: the most processes its commands may run; null before it.
  `ALTER TABLE sandboxes ADD COLUMN max_processes INTEGER;`,
  // 10: tenants and their API keys; every row before it belongs to the `default` tenant.
  `CREATE TABLE tenants (
     id TEXT PRIMARY KEY,
     quota TEXT NOT NULL DEFAULT '{}',
     created_at TEXT NOT NULL
   );
   INSERT INTO tenants (id, created_at) VALUES ('default', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
   CREATE TABLE api_keys (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL REFERENCES tenants(id),
     name TEXT NOT NULL,
     digest TEXT NOT NULL UNIQUE,
     prefix TEXT NOT NULL,
     last4 TEXT NOT NULL,
     scopes TEXT NOT NULL,
     created_at TEXT NOT NULL,
     expires_at TEXT,
     revoked_at TEXT,
     last_used_at TEXT
   );
   ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
   CREATE INDEX sandboxes_tenant ON sandboxes(tenant, state);
   ALTER TABLE commands ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
   ALTER TABLE events ADD COLUMN tenant TEXT;
   UPDATE events SET tenant = 'default';
   ALTER TABLE usage_sandbox ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
   CREATE TABLE idempotency_keys_by_tenant (
     tenant TEXT NOT NULL,
     key TEXT NOT NULL,
     fingerprint TEXT NOT NULL,
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     created_at TEXT NOT NULL,
     PRIMARY KEY (tenant, key)
   );
   INSERT INTO idempotency_keys_by_tenant SELECT 'default', key, fingerprint, sandbox_id, created_at FROM idempotency_keys;
   DROP TABLE idempotency_keys;
   ALTER TABLE idempotency_keys_by_tenant RENAME TO idempotency_keys;`,
  // 11: the egress gateway. Host policies (a tenant's default; a sandbox's own as asked for, with
  // the secrets it names), the vault (values sealed with AES-256-GCM, never stored in clear), each
  // sandbox's placeholders, and approvals.
  `ALTER TABLE tenants ADD COLUMN policy TEXT;
   ALTER TABLE sandboxes ADD COLUMN policy TEXT;
   CREATE TABLE secrets (
     tenant TEXT NOT NULL REFERENCES tenants(id),
     name TEXT NOT NULL,
     sealed BLOB NOT NULL,
     hosts TEXT NOT NULL,
     inject TEXT,
     created_at TEXT NOT NULL,
     updated_at TEXT NOT NULL,
     PRIMARY KEY (tenant, name)
   );
   CREATE TABLE sandbox_secrets (
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     name TEXT NOT NULL,
     env TEXT NOT NULL,
     placeholder TEXT NOT NULL UNIQUE,
     PRIMARY KEY (sandbox_id, name)
   );
   CREATE TABLE approvals (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL,
     sandbox_id TEXT NOT NULL,
     conversation_id TEXT,
     kind TEXT NOT NULL,
     method TEXT,
     host TEXT,
     path TEXT,
     tool TEXT,
     excerpt TEXT NOT NULL,
     rule TEXT NOT NULL,
     state TEXT NOT NULL,
     created_at TEXT NOT NULL,
     expires_at TEXT NOT NULL,
     decided_at TEXT,
     decided_by TEXT,
     grant_kind TEXT,
     grant_until TEXT,
     reason TEXT
   );
   CREATE INDEX approvals_tenant ON approvals(tenant, state, created_at);
   CREATE INDEX approvals_sandbox ON approvals(sandbox_id, state);`,
  // 12: a tenant's events as one range, so its replay pages through its own rows only.
  `CREATE INDEX events_tenant ON events(tenant, seq);`,
  // 13: what the E2B surface keeps per sandbox beyond bothy's own rows, so a restart keeps it: the
  // create's envVars (sealed with the vault's key) and which bothy command each guest pid is.
  `CREATE TABLE e2b_envs (
     sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id),
     sealed BLOB NOT NULL
   );
   CREATE TABLE e2b_processes (
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     pid INTEGER NOT NULL,
     command_id TEXT NOT NULL,
     config TEXT NOT NULL,
     pty INTEGER NOT NULL,
     tag TEXT,
     signalled TEXT,
     PRIMARY KEY (sandbox_id, pid)
   );`,
  // 14: the dashboard's sign-in sessions (auth/ui-sessions.ts): only a digest of each session id,
  // with the key it acts as; a revoked key's sessions are refused by the key's own row.
  `CREATE TABLE ui_sessions (
     digest TEXT PRIMARY KEY,
     key_id TEXT NOT NULL REFERENCES api_keys(id),
     created_at TEXT NOT NULL,
     expires_at TEXT NOT NULL
   );
   CREATE INDEX ui_sessions_key ON ui_sessions(key_id);`,
  // 15: volumes (an ext4 image each, under $BOTHY_HOME/volumes/<id>/) and which sandbox mounts which
  // where, so a restarted server mounts them again; a claim counts while its sandbox's row is live.
  `CREATE TABLE volumes (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL,
     name TEXT NOT NULL,
     size_mib INTEGER NOT NULL,
     created_at TEXT NOT NULL,
     UNIQUE (tenant, name)
   );
   CREATE TABLE sandbox_volumes (
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     volume_id TEXT NOT NULL REFERENCES volumes(id),
     path TEXT NOT NULL,
     read_only INTEGER NOT NULL,
     PRIMARY KEY (sandbox_id, volume_id)
   );
   CREATE INDEX sandbox_volumes_volume ON sandbox_volumes(volume_id);`,
  // 16: snapshots (a read-only layer each, under $BOTHY_HOME/snapshots/layers/) and which sandbox
  // started from which; a use counts while its sandbox's row is live.
  `CREATE TABLE snapshots (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL,
     name TEXT,
     source_sandbox_id TEXT NOT NULL,
     template TEXT NOT NULL,
     template_hash TEXT NOT NULL,
     driver TEXT NOT NULL,
     layer_id TEXT NOT NULL,
     template_layer TEXT NOT NULL,
     bytes BIGINT NOT NULL,
     created_at TEXT NOT NULL,
     idempotency_key TEXT,
     UNIQUE (tenant, name),
     UNIQUE (tenant, idempotency_key)
   );
   CREATE TABLE sandbox_snapshots (
     sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id),
     snapshot_id TEXT NOT NULL REFERENCES snapshots(id)
   );
   CREATE INDEX sandbox_snapshots_snapshot ON sandbox_snapshots(snapshot_id);`,
  // 17: a sandbox's lifecycle beyond the defaults (lifecycle-rows.ts): sleep instead of delete at its
  // timeout, whether a call wakes it, and why it sleeps now.
  `CREATE TABLE sandbox_lifecycle (
     sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id),
     on_timeout TEXT NOT NULL,
     auto_wake INTEGER NOT NULL,
     timeout_s INTEGER NOT NULL,
     asleep_by TEXT
   );`,
  // 18: metered usage per owner and UTC day, for the dashboard's chart of a month against its budget.
  `CREATE TABLE usage_day (
     owner TEXT NOT NULL,
     day TEXT NOT NULL,
     vcpu_seconds REAL NOT NULL DEFAULT 0,
     gib_seconds REAL NOT NULL DEFAULT 0,
     PRIMARY KEY (owner, day)
   );`,
  // 19: several machines on one database (cluster/): each node's row and lease (times are the
  // database clock's, in ms since 1970; an epoch per holding of the lease), the node and epoch that
  // own each sandbox (null: a single machine's own), and named leases such as the leader's.
  `CREATE TABLE nodes (
     id TEXT PRIMARY KEY,
     url TEXT NOT NULL,
     drivers TEXT NOT NULL,
     templates TEXT NOT NULL,
     vcpu INTEGER NOT NULL,
     memory_mib INTEGER NOT NULL,
     slots INTEGER NOT NULL,
     epoch BIGINT NOT NULL,
     started_at BIGINT NOT NULL,
     heartbeat_at BIGINT NOT NULL,
     lease_expires_at BIGINT NOT NULL
   );
   ALTER TABLE sandboxes ADD COLUMN node_id TEXT;
   ALTER TABLE sandboxes ADD COLUMN node_epoch BIGINT;
   CREATE INDEX sandboxes_node ON sandboxes(node_id, state);
   CREATE TABLE cluster_leases (
     name TEXT PRIMARY KEY,
     holder TEXT NOT NULL,
     epoch BIGINT NOT NULL,
     expires_at BIGINT NOT NULL
   );`,
  // 20: one policy layer across nodes: the node whose process holds a pending approval's caller (a
  // start cancels only its own node's; null: a single machine's), and the vault key's fingerprint
  // (an HMAC under the key, never the key), so a node started with another key refuses to start.
  `ALTER TABLE approvals ADD COLUMN node_id TEXT;
   CREATE TABLE vault_check (
     id INTEGER PRIMARY KEY CHECK (id = 1),
     fingerprint TEXT NOT NULL,
     created_at TEXT NOT NULL
   );`,
  // 21: whether a snapshot kept memory and processes (1) or files only (0); null for one taken
  // before it, which its layer's folder answers (snapshot-service.ts `keptMemory`).
  `ALTER TABLE snapshots ADD COLUMN memory INTEGER;`,
  // 22: a drained node takes no new sandboxes (cluster/placement.ts); it stays drained across restarts.
  `ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;`,
];
