/**
 * A model for tests and offline runs: it plays a fixed list of tool calls, then answers with a
 * summary of what the tools gave. No network, no keys.
 */
import type { Message, Model, ModelTurn } from "./agent.ts";
import type { ToolCall } from "./tools.ts";

export function scriptedModel(script: readonly ToolCall[]): Model {
  let next = 0;
  return async (messages: readonly Message[]): Promise<ModelTurn> => {
    const call = script[next++];
    if (call) return { call };
    const results = messages.filter((m) => m.role === "tool");
    const failed = results.filter((m) => !m.result.ok).length;
    return { final: `ran ${results.length} tool calls, ${failed} failed` };
  };
}

/** The program the demo writes into the sandbox: it draws a 4x3 orange PNG with Node alone (no packages). */
const DRAW_MJS = `import { deflateSync } from "node:zlib";
import { writeFileSync } from "node:fs";
const table = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
const crc32 = (buf) => {
  let c = 0xffffffff;
  for (const b of buf) c = table[(c ^ b) & 255] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
};
const chunk = (type, data) => {
  const body = Buffer.concat([Buffer.from(type), data]);
  const head = Buffer.alloc(4);
  head.writeUInt32BE(data.length);
  const tail = Buffer.alloc(4);
  tail.writeUInt32BE(crc32(body));
  return Buffer.concat([head, body, tail]);
};
const [w, h] = [4, 3];
const ihdr = Buffer.alloc(13);
ihdr.writeUInt32BE(w, 0);
ihdr.writeUInt32BE(h, 4);
ihdr[8] = 8; // bit depth
ihdr[9] = 2; // RGB
const row = Buffer.from([0, ...Array(w).fill([255, 128, 0]).flat()]);
const signature = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const idat = deflateSync(Buffer.concat(Array(h).fill(row)));
writeFileSync(process.argv[2], Buffer.concat([signature, chunk("IHDR", ihdr), chunk("IDAT", idat), chunk("IEND", Buffer.alloc(0))]));
console.log(\`drew \${w}x\${h}\`);
`;

/** The demo task's script: write a program, run it (it draws a PNG), read its output, look at the image. */
export const DEMO_SCRIPT: readonly ToolCall[] = [
  { tool: "run_command", input: { cmd: "mkdir -p /workspace/agent && node --version" } },
  { tool: "write_file", input: { path: "/workspace/agent/draw.mjs", content: DRAW_MJS } },
  { tool: "run_command", input: { cmd: "cd /workspace/agent && node draw.mjs dot.png > out.txt" } },
  { tool: "read_file", input: { path: "/workspace/agent/out.txt" } },
  { tool: "view_image", input: { path: "/workspace/agent/dot.png" } },
  { tool: "run_command", input: { cmd: "exit 3" } },
];
