/**
 * A TLS terminator on loopback in front of a server that speaks plain HTTP (BOTHY_INSECURE_HTTP=1
 * expects one): a self-signed certificate for the names given, made with openssl in a directory
 * of ours, and each connection piped both ways to the server (pipe() carries backpressure). The
 * dashboard's cookie is Secure behind it, as in a real deployment.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { connect, type AddressInfo, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer } from "node:tls";
import { promisify } from "node:util";

const pexec = promisify(execFile);

export interface TlsFront {
  /** The loopback port it listens on. */
  port: number;
  close(): Promise<void>;
}

export async function startTlsFront(target: { host: string; port: number }, names: string[]): Promise<TlsFront> {
  const dir = await mkdtemp(join(tmpdir(), "bothy-tls-front-"));
  try {
    const san = names.map((n) => `DNS:${n}`).join(",");
    await pexec("openssl", [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-days",
      "1",
      "-subj",
      `/CN=${names[0] ?? "localhost"}`,
      "-addext",
      `subjectAltName=${san}`,
      "-keyout",
      join(dir, "key.pem"),
      "-out",
      join(dir, "cert.pem"),
    ]);
    const sockets = new Set<Socket>();
    const server = createServer(
      { key: await readFile(join(dir, "key.pem")), cert: await readFile(join(dir, "cert.pem")) },
      (front) => {
        const back = connect(target.port, target.host);
        sockets.add(front);
        sockets.add(back);
        front.pipe(back).pipe(front);
        const end = (): void => {
          front.destroy();
          back.destroy();
          sockets.delete(front);
          sockets.delete(back);
        };
        front.on("error", end).on("close", end);
        back.on("error", end).on("close", end);
      },
    );
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return {
      port: (server.address() as AddressInfo).port,
      close: async () => {
        for (const s of sockets) s.destroy();
        await new Promise((resolve) => server.close(resolve));
        await rm(dir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
}
