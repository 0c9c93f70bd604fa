import { APPROVAL_STATES, approvalInfo, type ApprovalInfo, type ApprovalState } from "@bothy/protocol";
import { Approvals, Sandbox } from "@bothy/sdk";
import { connection, intFlag, JSON_FLAG, UsageError } from "../args/parse.ts";
import { subcommandsCommand } from "../command.ts";
import { printJson, printList, relative } from "../output.ts";

const USAGE = `usage: bothy approvals ls [--state STATE] [--sandbox ID] [--json]
       bothy approvals approve ID [--host-minutes N] [--reason R] [--json]
       bothy approvals deny ID [--reason R] [--json]
       bothy approvals watch [--json]

What an \`ask\` rule of a host policy holds (a request through the egress gateway, or an agent
tool's call) until someone decides. Needs a key with the approvals:decide scope (watch also
sandboxes:read, for the event stream).

  ls               newest first; --state pending|approved|denied|expired|cancelled
  approve ID       the held request goes out once; --host-minutes N also lets the sandbox's
                   requests to that host through for N minutes
  deny ID          the held request is refused (403) or the tool call fails
  watch            prints each pending approval and each new one as it is asked, with how to
                   decide it (Ctrl-C to stop)
`;

export const approvalsCommand = subcommandsCommand({
  name: "approvals",
  summary: "list, approve, deny and watch approvals",
  usage: USAGE,
  options: {
    ...JSON_FLAG,
    state: { type: "string" },
    sandbox: { type: "string" },
    "host-minutes": { type: "string" },
    reason: { type: "string" },
  },
  positionals: { min: 0, max: 1, names: "approval id" },
  async run(sub, { values, positionals }) {
    const conn = connection(values);
    const reason = values.reason === undefined ? {} : { reason: values.reason };
    const show = (a: ApprovalInfo): void => {
      if (values.json) printJson(a);
      else
        process.stdout.write(`${a.approval_id} ${a.state}${a.grant?.until ? ` (host until ${a.grant.until})` : ""}\n`);
    };
    if (sub === "ls" || sub === "list") {
      const state = values.state;
      if (state !== undefined && !(APPROVAL_STATES as readonly string[]).includes(state))
        throw new UsageError(`--state takes one of ${APPROVAL_STATES.join(", ")}, got "${state}"`);
      const list = await Approvals.list({
        ...conn,
        ...(state === undefined ? {} : { state: state as ApprovalState }),
        ...(values.sandbox === undefined ? {} : { sandboxId: values.sandbox }),
      });
      printList(
        values.json,
        "approvals",
        list,
        ["ID", "STATE", "SANDBOX", "WHAT", "RULE", "CREATED", "EXPIRES"],
        (a) => [
          a.approval_id,
          a.state,
          a.sandbox_id,
          what(a),
          a.rule,
          relative(a.created_at),
          a.state === "pending" ? relative(a.expires_at) : "-",
        ],
      );
      return 0;
    }
    if (sub === "approve" || sub === "deny") {
      const id = positionals[0];
      if (id === undefined) throw new UsageError("missing approval id");
      if (sub === "deny" && values["host-minutes"] !== undefined)
        throw new UsageError("--host-minutes applies to approve only");
      const hostMinutes = intFlag(values["host-minutes"], "host-minutes");
      show(
        sub === "approve"
          ? await Approvals.approve(id, { ...conn, ...reason, ...(hostMinutes === undefined ? {} : { hostMinutes }) })
          : await Approvals.deny(id, { ...conn, ...reason }),
      );
      return 0;
    }
    if (sub === "watch") return watch(conn, values.json === true);
    throw new UsageError(`unknown subcommand ${sub}`);
  },
});

/** `POST api.github.com/repos/x`, or `tool send_file`. */
function what(a: ApprovalInfo): string {
  if (a.kind === "tool") return `tool ${a.tool ?? "?"}`;
  return `${a.method ?? "?"} ${a.host ?? "?"}${a.path ?? ""}`;
}

function announce(a: ApprovalInfo, json: boolean): void {
  if (json) {
    process.stdout.write(`${JSON.stringify(a)}\n`);
    return;
  }
  const excerpt = a.excerpt
    ? `\n  ${a.excerpt.slice(0, 200).replaceAll("\n", " ")}${a.excerpt.length > 200 ? "…" : ""}`
    : "";
  process.stdout.write(
    `${a.approval_id}  sandbox ${a.sandbox_id}  ${what(a)}  (rule ${a.rule}, expires ${relative(a.expires_at)})${excerpt}\n` +
      `  approve: bothy approvals approve ${a.approval_id} [--host-minutes N]    deny: bothy approvals deny ${a.approval_id}\n`,
  );
}

/**
 * Opens the event stream first, then prints what is pending, then each new approval as it is
 * asked: one asked in between is in the list or in the stream (printed once), never in neither.
 */
async function watch(conn: ReturnType<typeof connection>, json: boolean): Promise<number> {
  const controller = new AbortController();
  const stop = (): void => controller.abort();
  process.once("SIGINT", stop);
  const shown = new Set<string>();
  const show = (a: ApprovalInfo): void => {
    if (shown.has(a.approval_id)) return;
    shown.add(a.approval_id);
    announce(a, json);
  };
  try {
    let opened!: () => void;
    const open = new Promise<void>((resolve) => (opened = resolve));
    const stream = Sandbox.events({ ...conn, signal: controller.signal, onOpen: () => opened() })[
      Symbol.asyncIterator
    ]();
    const first = stream.next();
    // A stream that fails before it opens ends the wait with its error.
    await Promise.race([open, first]);
    for (const a of (await Approvals.list({ ...conn, state: "pending", signal: controller.signal })).reverse()) show(a);
    process.stderr.write("watching for approvals (Ctrl-C to stop)\n");
    for (let next = await first; !next.done; next = await stream.next()) {
      if (next.value.type !== "approval.requested") continue;
      const parsed = approvalInfo.safeParse(next.value.data);
      if (parsed.success) show(parsed.data);
    }
  } catch (err) {
    if (!controller.signal.aborted) throw err;
  } finally {
    process.off("SIGINT", stop);
  }
  return 0;
}
