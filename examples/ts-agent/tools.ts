/**
 * The computer tools an agent's model may call, each on one bothy sandbox through `@bothy/sdk`:
 * run a command, read a file, write a file, view an image. Every result is plain JSON a model can
 * read (an image as base64 PNG); a failing command is a result, not an exception, so the model
 * sees the exit code and stderr and can try something else.
 */
import type { Sandbox } from "@bothy/sdk";

export type ToolCall =
  | { tool: "run_command"; input: { cmd: string; timeout_s?: number } }
  | { tool: "read_file"; input: { path: string } }
  | { tool: "write_file"; input: { path: string; content: string } }
  | { tool: "view_image"; input: { path?: string } };

export type ToolResult = { ok: true; [field: string]: unknown } | { ok: false; error: string };

/** The tools' descriptions in the JSON-schema form model APIs take (OpenAI `tools`, Anthropic `tools`). */
export const TOOL_SPECS = [
  {
    name: "run_command",
    description: "Runs a shell command in the sandbox; answers its exit code, stdout and stderr.",
    input_schema: {
      type: "object",
      properties: { cmd: { type: "string" }, timeout_s: { type: "number" } },
      required: ["cmd"],
    },
  },
  {
    name: "read_file",
    description: "Reads a text file of the sandbox.",
    input_schema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  },
  {
    name: "write_file",
    description: "Writes a text file in the sandbox (its folder must exist).",
    input_schema: {
      type: "object",
      properties: { path: { type: "string" }, content: { type: "string" } },
      required: ["path", "content"],
    },
  },
  {
    name: "view_image",
    description: "Shows a PNG file of the sandbox; without a path, a screenshot of its desktop (template desktop).",
    input_schema: { type: "object", properties: { path: { type: "string" } } },
  },
] as const;

/** Output past this many characters is cut (a model's context is finite). */
const MAX_OUTPUT_CHARS = 16_000;
const cut = (text: string): string =>
  text.length > MAX_OUTPUT_CHARS
    ? `${text.slice(0, MAX_OUTPUT_CHARS)}\n[... ${text.length - MAX_OUTPUT_CHARS} more characters]`
    : text;

const PNG_SIGNATURE = "89504e470d0a1a0a";

/** Runs one tool call; errors from the sandbox become a result the model reads. */
export async function runTool(sandbox: Sandbox, call: ToolCall): Promise<ToolResult> {
  try {
    switch (call.tool) {
      case "run_command": {
        const result = await sandbox.commands.run(call.input.cmd, {
          throwOnError: false,
          ...(call.input.timeout_s === undefined ? {} : { timeout: call.input.timeout_s }),
        });
        return { ok: true, exit_code: result.exitCode, stdout: cut(result.stdout), stderr: cut(result.stderr) };
      }
      case "read_file":
        return { ok: true, content: cut(await sandbox.files.read(call.input.path)) };
      case "write_file": {
        const info = await sandbox.files.write(call.input.path, call.input.content);
        return { ok: true, path: info.path, size: info.size };
      }
      case "view_image": {
        const png =
          call.input.path === undefined
            ? (await sandbox.desktop.screenshot()).png
            : await sandbox.files.read(call.input.path, { format: "bytes" });
        if (Buffer.from(png.subarray(0, 8)).toString("hex") !== PNG_SIGNATURE)
          return { ok: false, error: `${call.input.path ?? "the screenshot"} is not a PNG file` };
        return { ok: true, media_type: "image/png", base64: Buffer.from(png).toString("base64") };
      }
    }
  } catch (err) {
    return { ok: false, error: err instanceof Error ? err.message : String(err) };
  }
}
