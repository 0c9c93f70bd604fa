/**
 * Several machines' settings: BOTHY_DATABASE_URL makes this server a node, which then needs the URL
 * the others reach it at; a start without it stops with what to set, never with the database's URL
 * (its password) in the message.
 */
import { describe, expect, it } from "vitest";
import { loadConfig } from "../src/config.ts";

const URL_WITH_PASSWORD = "postgres://bothy:s3cret-password@db.internal:5432/bothy";

describe("cluster configuration", () => {
  it("is off without BOTHY_DATABASE_URL: one machine on SQLite", () => {
    expect(loadConfig({}).cluster).toBeUndefined();
  });

  it("with BOTHY_DATABASE_URL needs BOTHY_NODE_URL, and says so without echoing the URL", () => {
    let message = "";
    try {
      loadConfig({ BOTHY_DATABASE_URL: URL_WITH_PASSWORD });
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/BOTHY_NODE_URL must be too/);
    expect(message).not.toContain("s3cret-password");
  });

  it("refuses a URL that is not PostgreSQL's, and node settings without a database", () => {
    expect(() => loadConfig({ BOTHY_DATABASE_URL: "mysql://u:s3cret-password@h/db" })).toThrow(
      /BOTHY_DATABASE_URL: must be a postgres:\/\/ or postgresql:\/\/ URL/,
    );
    expect(() => loadConfig({ BOTHY_DATABASE_URL: "mysql://u:s3cret-password@h/db" })).not.toThrow(/s3cret/);
    expect(() => loadConfig({ BOTHY_NODE_URL: "http://10.0.0.11:8080" })).toThrow(/need BOTHY_DATABASE_URL/);
    expect(() =>
      loadConfig({ BOTHY_DATABASE_URL: URL_WITH_PASSWORD, BOTHY_NODE_URL: "http://n1:8080", BOTHY_NODE_ID: "Bad_Id" }),
    ).toThrow(/BOTHY_NODE_ID/);
  });

  it("gives the node its URL, id and lease", () => {
    expect(
      loadConfig({
        BOTHY_DATABASE_URL: URL_WITH_PASSWORD,
        BOTHY_NODE_URL: "http://10.0.0.11:8080",
        BOTHY_NODE_ID: "worker-1.example",
        BOTHY_NODE_LEASE_S: "9",
        BOTHY_CLUSTER_SECRET_FILE: "/etc/bothy/cluster.secret",
      }).cluster,
    ).toEqual({
      databaseUrl: URL_WITH_PASSWORD,
      nodeUrl: "http://10.0.0.11:8080",
      nodeId: "worker-1.example",
      leaseMs: 9000,
      secretFile: "/etc/bothy/cluster.secret",
    });
  });
});
