import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse, UsageError } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { printJson } from "../output.ts";

const USAGE = `usage: bothy port ID PORT    print the URL that reaches PORT inside the sandbox
       bothy port ID PORT --link [--ttl SECONDS] [--json]
                             print a signed link that opens PORT in a browser with no API
                             key until it expires (default 3600 s, at most 86400)
       bothy port ID PORT --forward LOCAL
                             serve 127.0.0.1:LOCAL (0: any free port) as PORT inside the
                             sandbox, raw TCP (a database, SSH, HTTP), until Ctrl-C
       bothy port ID [--json]    list the ports listening inside it

HTTP and WebSocket to the URL are relayed to 127.0.0.1:PORT inside the sandbox.
`;

export const portCommand: Command = {
  name: "port",
  summary: "print the URL of a port inside a sandbox, or list its ports",
  usage: USAGE,
  async run(args) {
    const { values, positionals } = parse(
      args,
      {
        ...CONNECTION_FLAGS,
        ...JSON_FLAG,
        forward: { type: "string" },
        link: { type: "boolean" },
        ttl: { type: "string" },
      },
      { min: 1, max: 2, names: "sandbox ID and PORT" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const sandbox = await Sandbox.connect(positionals[0] ?? "", connection(values));
    const raw = positionals[1];
    if (raw === undefined) {
      const ports = await sandbox.ports.list();
      if (values.json) printJson({ ports });
      else for (const p of ports) process.stdout.write(`${p.port}\t${p.address}\t${sandbox.ports.url(p.port)}\n`);
      return 0;
    }
    const port = /^[0-9]{1,5}$/.test(raw) ? Number(raw) : NaN;
    if (!(port >= 1 && port <= 65535)) throw new UsageError(`"${raw}" is not a TCP port (1-65535)`);
    if (values.link) {
      const ttlS = values.ttl === undefined ? undefined : Number(values.ttl);
      if (ttlS !== undefined && !(Number.isInteger(ttlS) && ttlS >= 1 && ttlS <= 86_400))
        throw new UsageError(`--ttl "${values.ttl}" is not a number of seconds (1-86400)`);
      const link = await sandbox.ports.link(port, ttlS === undefined ? {} : { ttlS });
      if (values.json) printJson(link);
      else process.stdout.write(`${link.url}\n`);
      return 0;
    }
    if (values.forward === undefined) {
      process.stdout.write(`${sandbox.ports.url(port)}\n`);
      return 0;
    }
    const local = /^[0-9]{1,5}$/.test(values.forward) ? Number(values.forward) : NaN;
    if (!(local >= 0 && local <= 65535))
      throw new UsageError(`--forward "${values.forward}" is not a local port (0-65535)`);
    const forward = await sandbox.ports.forward(port, { localPort: local });
    process.stdout.write(
      `forwarding ${forward.host}:${forward.localPort} -> port ${port} in ${sandbox.sandboxId} (Ctrl-C to stop)\n`,
    );
    await new Promise<void>((resolve) => {
      process.once("SIGINT", resolve);
      process.once("SIGTERM", resolve);
    });
    await forward.close();
    return 0;
  },
};
