import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { hostname as hostname_ } from "node:os";
import { describe, expect, it } from "vitest";
import { api, createSandbox, deleteSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "files API"), () => {
    let ts: TestServer;
    let id: string;

    useServerWithSandbox(driver.name, (server, sandbox) => {
      ts = server;
      id = sandbox;
    });

    const filesUrl = (query: Record<string, string>, sub = ""): string =>
      `${ts.url}/sandboxes/${id}/files${sub}?${new URLSearchParams(query).toString()}`;
    const sha = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");

    async function put(path: string, body: Buffer | string, headers: Record<string, string> = {}): Promise<Response> {
      return fetch(filesUrl({ path }), {
        method: "PUT",
        body,
        headers: { "content-type": "application/octet-stream", ...headers },
      });
    }

    describe("files API", () => {
      it("writes and reads back bytes exactly, with their sha256", async () => {
        const data = randomBytes(200_000);
        const res = await put("/workspace/blob.bin", data);
        expect(res.status).toBe(200);
        expect(await res.json()).toMatchObject({ path: "/workspace/blob.bin", size: data.length, sha256: sha(data) });
        const back = await fetch(filesUrl({ path: "/workspace/blob.bin" }));
        expect(back.headers.get("content-type")).toBe("application/octet-stream");
        expect(Number(back.headers.get("content-length"))).toBe(data.length);
        expect(Buffer.from(await back.arrayBuffer()).equals(data)).toBe(true);
      });

      it("serves a sandbox's HTML on the API's origin only as an inert download", async () => {
        // The sandbox's code writes a page meant to run script as the API's origin once a person opens its URL.
        await put("/workspace/evil.html", "<script>fetch('/keys').then((r) => r.text()).then(alert)</script>");
        const res = await fetch(filesUrl({ path: "/workspace/evil.html" }));
        expect(res.status).toBe(200);
        expect(res.headers.get("content-type")).toBe("application/octet-stream");
        expect(res.headers.get("content-disposition")).toBe("attachment");
        expect(res.headers.get("content-security-policy")).toBe("sandbox");
        expect(res.headers.get("x-content-type-options")).toBe("nosniff");
      });

      it("resolves relative paths from /workspace, inside the sandbox", async () => {
        await put("notes/../rel.txt", "relative");
        const r = await runCommand(ts.wsUrl, id, { cmd: "cat /workspace/rel.txt" });
        expect(r.stdout).toBe("relative");
      });

      it("refuses a stale write with 412 and accepts a current one (If-Match)", async () => {
        const first = (await (await put("guarded.txt", "v1")).json()) as { sha256: string };
        const stale = await put("guarded.txt", "v2", { "if-match": `"${sha("something else")}"` });
        expect(stale.status).toBe(412);
        expect(await stale.json()).toMatchObject({ code: "precondition_failed" });
        expect(await (await fetch(filesUrl({ path: "guarded.txt" }))).text()).toBe("v1");
        const ok = await put("guarded.txt", "v2", { "if-match": `"${first.sha256}"` });
        expect(ok.status).toBe(200);
        expect(await (await fetch(filesUrl({ path: "guarded.txt" }))).text()).toBe("v2");
        const stat = await api(ts.url, "GET", `/sandboxes/${id}/files/stat?path=guarded.txt&sha256=true`);
        expect(stat.json).toMatchObject({ type: "file", size: 2, sha256: sha("v2") });
      });

      it("lists, makes directories, renames and deletes", async () => {
        expect(
          (await api(ts.url, "POST", `/sandboxes/${id}/files/mkdir`, { path: "tree/a/b", parents: true })).status,
        ).toBe(200);
        expect((await api(ts.url, "POST", `/sandboxes/${id}/files/mkdir`, { path: "tree" })).json["code"]).toBe(
          "file_exists",
        );
        await put("tree/one.txt", "1");
        expect(
          (await api(ts.url, "POST", `/sandboxes/${id}/files/rename`, { from: "tree/one.txt", to: "tree/two.txt" }))
            .status,
        ).toBe(200);
        const list = await api(ts.url, "GET", `/sandboxes/${id}/files/list?path=tree`);
        expect(
          (list.json["entries"] as Array<{ name: string; type: string }>).map((e) => `${e.name}:${e.type}`),
        ).toEqual(["a:dir", "two.txt:file"]);
        expect((await api(ts.url, "DELETE", `/sandboxes/${id}/files?path=tree`)).json["code"]).toBe("file_error");
        expect((await api(ts.url, "DELETE", `/sandboxes/${id}/files?path=tree&recursive=true`)).status).toBe(200);
        expect((await api(ts.url, "GET", `/sandboxes/${id}/files/stat?path=tree`)).status).toBe(404);
      });

      it("never reaches the host, whatever the path", async () => {
        const marker = `bothy-escape-${Date.now()}`;
        // Absolute, dot-dot and symlinked paths all land in the sandbox's own tree.
        await put(`/../../../../tmp/${marker}`, "x");
        await put(`../../../../../tmp/${marker}-2`, "x");
        await runCommand(ts.wsUrl, id, { cmd: "ln -sfn / /workspace/hostroot && ln -sfn /tmp /workspace/hosttmp" });
        await put(`/workspace/hostroot/tmp/${marker}-3`, "x");
        await put(`/workspace/hosttmp/${marker}-4`, "x");
        for (const suffix of ["", "-2", "-3", "-4"]) expect(existsSync(`/tmp/${marker}${suffix}`)).toBe(false);
        const inside = await runCommand(ts.wsUrl, id, { cmd: `ls /tmp | grep -c ${marker}` });
        expect(inside.stdout.trim()).toBe("4");
        // Reading the host's files by path gets the sandbox's files instead.
        const hostname = await (await fetch(filesUrl({ path: "/etc/hostname" }))).text();
        expect(hostname.trim()).not.toBe(hostname_());
      });

      it("reads through a symlink the linked file's bytes, with their length", async () => {
        const big = randomBytes(100_000);
        await runCommand(ts.wsUrl, id, { cmd: "mkdir -p /workspace/links" });
        await put("/workspace/links/big.bin", big);
        await put("/workspace/links/small.txt", "abc");
        const made = await runCommand(ts.wsUrl, id, {
          cmd: "cd /workspace/links && ln -s big.bin biglink && ln -s small.txt smalllink && echo ok",
        });
        expect(made.stdout).toBe("ok\n");
        for (const [path, bytes] of [
          ["/workspace/links/biglink", big],
          ["/workspace/links/smalllink", Buffer.from("abc")],
        ] as const) {
          const res = await fetch(filesUrl({ path }));
          expect(res.status).toBe(200);
          expect(Number(res.headers.get("content-length"))).toBe(bytes.length);
          expect(Buffer.from(await res.arrayBuffer()).equals(bytes)).toBe(true);
        }
      });

      it("answers a read of a link to a directory, a dangling link, a link loop or a fifo with problem+json", async () => {
        const made = await runCommand(ts.wsUrl, id, {
          cmd:
            "mkdir -p /workspace/odd/dir && cd /workspace/odd && ln -s dir dirlink && ln -s nowhere dangling && " +
            "ln -s loop2 loop1 && ln -s loop1 loop2 && mkfifo fifo && echo ok",
        });
        expect(made.stdout).toBe("ok\n");
        const expected: Array<[string, number, string]> = [
          ["/workspace/odd/dirlink", 400, "file_error"],
          ["/workspace/odd/dangling", 404, "file_not_found"],
          ["/workspace/odd/loop1", 400, "file_error"],
          ["/workspace/odd/fifo", 400, "file_error"],
        ];
        for (const [path, status, code] of expected) {
          const res = await api(ts.url, "GET", `/sandboxes/${id}/files?path=${encodeURIComponent(path)}`);
          expect({ path, status: res.status, type: res.type, code: res.json["code"] }).toEqual({
            path,
            status,
            type: expect.stringContaining("application/problem+json"),
            code,
          });
        }
      });

      it("makes directories through a symlink to /, and the sandbox answers afterwards", async () => {
        expect((await runCommand(ts.wsUrl, id, { cmd: "ln -sfn / /workspace/rootlink && echo ok" })).stdout).toBe(
          "ok\n",
        );
        const made = await api(ts.url, "POST", `/sandboxes/${id}/files/mkdir`, {
          path: "/workspace/rootlink/tmp/x",
          parents: true,
        });
        expect(made.json).toEqual({ path: "/workspace/rootlink/tmp/x", created: true });
        const alone = await api(ts.url, "POST", `/sandboxes/${id}/files/mkdir`, { path: "/workspace/rootlink/tmp/y" });
        expect(alone.status).toBe(200);
        const check = await runCommand(ts.wsUrl, id, { cmd: "test -d /tmp/x && test -d /tmp/y && echo alive" });
        expect(check.stdout).toBe("alive\n");
      });

      it("serves file requests without starting threads in the agent", async () => {
        // A sandbox of its own: the one the other tests share has served requests already.
        const fresh = await createSandbox(ts.url);
        try {
          const freshUrl = (sub: string, query: Record<string, string>): string =>
            `${ts.url}/sandboxes/${fresh}/files${sub}?${new URLSearchParams(query).toString()}`;
          // The agent's threads, as the sandbox's own /proc shows them: the node whose arguments name
          // the agent (gVisor: its snapshot; QEMU: agent.mjs), not bothy-init, which starts it.
          const agentThreads = async (): Promise<number> => {
            const r = await runCommand(ts.wsUrl, fresh, {
              cmd: "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^[^ ]*node .*/opt/bothy/[a]gent' && ls $p/task | wc -l; done",
            });
            const counts = r.stdout.trim().split("\n");
            expect(counts).toHaveLength(1);
            return Number(counts[0]);
          };
          const before = await agentThreads();
          expect(before).toBeGreaterThan(0);
          const body = randomBytes(1024);
          const written = await fetch(freshUrl("", { path: "t/one.bin" }), {
            method: "PUT",
            body,
            headers: { "content-type": "application/octet-stream" },
          });
          expect(written.status).toBe(404); // no directory t yet: refused without leaving anything
          expect(
            (await api(ts.url, "POST", `/sandboxes/${fresh}/files/mkdir`, { path: "t/u", parents: true })).status,
          ).toBe(200);
          expect((await api(ts.url, "POST", `/sandboxes/${fresh}/files/mkdir`, { path: "t/v" })).status).toBe(200);
          const put1 = await fetch(freshUrl("", { path: "t/one.bin" }), {
            method: "PUT",
            body,
            headers: { "content-type": "application/octet-stream" },
          });
          expect(put1.status).toBe(200);
          const put2 = await fetch(freshUrl("", { path: "t/one.bin" }), {
            method: "PUT",
            body: "two",
            headers: { "content-type": "application/octet-stream", "if-match": `"${sha(body)}"` },
          });
          expect(put2.status).toBe(200);
          expect(await (await fetch(freshUrl("", { path: "t/one.bin" }))).text()).toBe("two");
          expect(
            (await api(ts.url, "GET", `/sandboxes/${fresh}/files/stat?path=t/one.bin&sha256=true`)).json,
          ).toMatchObject({
            sha256: sha("two"),
          });
          expect(
            (await api(ts.url, "POST", `/sandboxes/${fresh}/files/rename`, { from: "t/one.bin", to: "t/u/two.bin" }))
              .status,
          ).toBe(200);
          const list = await api(ts.url, "GET", `/sandboxes/${fresh}/files/list?path=t`);
          expect((list.json["entries"] as Array<{ name: string }>).map((e) => e.name)).toEqual(["u", "v"]);
          expect((await api(ts.url, "DELETE", `/sandboxes/${fresh}/files?path=t/u/two.bin`)).status).toBe(200);
          expect((await api(ts.url, "DELETE", `/sandboxes/${fresh}/files?path=t/v`)).status).toBe(200);
          const put3 = await fetch(freshUrl("", { path: "t/u/three.txt" }), {
            method: "PUT",
            body: "3",
            headers: { "content-type": "application/octet-stream" },
          });
          expect(put3.status).toBe(200);
          expect((await api(ts.url, "DELETE", `/sandboxes/${fresh}/files?path=t&recursive=true`)).status).toBe(200);
          expect((await fetch(freshUrl("", { path: "t/u/three.txt" }))).status).toBe(404);
          expect(await agentThreads()).toBe(before);
        } finally {
          await deleteSandbox(ts.url, fresh);
        }
      });

      it("answers bad file requests with problem+json", async () => {
        const missing = await fetch(filesUrl({ path: "/nope/nothing" }));
        expect(missing.status).toBe(404);
        expect(await missing.json()).toMatchObject({ code: "file_not_found" });
        expect((await api(ts.url, "GET", `/sandboxes/${id}/files?path=/workspace`)).json["code"]).toBe("file_error");
        expect((await api(ts.url, "GET", `/sandboxes/${id}/files`)).json["code"]).toBe("invalid_request");
        expect((await api(ts.url, "GET", `/sandboxes/${id}/files?path=a%00b`)).json["code"]).toBe("invalid_request");
        expect((await put("x.txt", "x", { "if-match": "nope" })).status).toBe(400);
        expect((await api(ts.url, "GET", `/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/files?path=x`)).status).toBe(404);
      });
    });
  });
}
