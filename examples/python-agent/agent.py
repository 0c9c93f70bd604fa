"""A minimal tool-using agent loop: the model sees the task and every tool result so far and
answers either the next tool call or its final answer; the loop runs each call in the sandbox.
The model is any callable of that shape: ``scripted_model`` plays a script (for tests, offline);
README.md shows a real model's client in its place.

    BOTHY_URL=... BOTHY_API_KEY=... python3 examples/python-agent/agent.py

(with the repository's SDK on the path: ``PYTHONPATH=python/src``, or the wheel installed).
BOTHY_SANDBOX_ID names an existing sandbox to use; else a new one is made and killed at the end.
"""

import json
import os
from typing import Any, Callable, Dict, List, Sequence

from bothy import Sandbox

# Python puts this script's folder first on sys.path, so its neighbour imports as a module.
from tools import run_tool

Message = Dict[str, Any]
#: The next turn: ``{"tool": name, "input": {...}}`` or ``{"final": text}``.
Turn = Dict[str, Any]
Model = Callable[[List[Message]], Turn]


def run_agent(model: Model, sandbox: Sandbox, task: str, max_steps: int = 20) -> Dict[str, Any]:
    """Runs the loop until the model answers; returns its final answer and the conversation."""
    messages: List[Message] = [{"role": "user", "content": task}]
    for _ in range(max_steps):
        turn = model(messages)
        if "final" in turn:
            return {"final": turn["final"], "messages": messages}
        messages.append({"role": "assistant", "call": turn})
        result = run_tool(sandbox, turn["tool"], turn["input"])
        messages.append({"role": "tool", "tool": turn["tool"], "result": result})
    raise RuntimeError(f"The model gave no final answer within {max_steps} steps.")


def scripted_model(script: Sequence[Turn]) -> Model:
    """A model for tests and offline runs: it plays the script, then sums up what the tools gave."""
    calls = iter(script)

    def model(messages: List[Message]) -> Turn:
        call = next(calls, None)
        if call is not None:
            return dict(call)
        results = [m for m in messages if m["role"] == "tool"]
        failed = sum(1 for m in results if not m["result"]["ok"])
        return {"final": f"ran {len(results)} tool calls, {failed} failed"}

    return model


#: The program the demo writes into the sandbox: it draws a 4x3 orange PNG with Node alone (no packages).
DRAW_MJS = r"""import { deflateSync } from "node:zlib";
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
console.log(`drew ${w}x${h}`);
"""

#: The demo task's script: write a program, run it (it draws a PNG), read its output, look at the image.
DEMO_SCRIPT: List[Turn] = [
    {"tool": "run_command", "input": {"cmd": "mkdir -p /workspace/pyagent && node --version"}},
    {"tool": "write_file", "input": {"path": "/workspace/pyagent/draw.mjs", "content": DRAW_MJS}},
    {"tool": "run_command", "input": {"cmd": "cd /workspace/pyagent && node draw.mjs dot.png > out.txt"}},
    {"tool": "read_file", "input": {"path": "/workspace/pyagent/out.txt"}},
    {"tool": "view_image", "input": {"path": "/workspace/pyagent/dot.png"}},
    {"tool": "run_command", "input": {"cmd": "exit 3"}},
]


def main() -> None:
    existing = os.environ.get("BOTHY_SANDBOX_ID")
    sandbox = Sandbox.connect(existing) if existing else Sandbox.create("seed")
    try:
        # A real model goes here instead (README.md): the loop and the tools stay as they are.
        model = scripted_model(DEMO_SCRIPT)
        run = run_agent(model, sandbox, "Draw a small PNG with Python in the sandbox and look at it.")
        print(json.dumps(run, indent=2))
    finally:
        if not existing:
            sandbox.kill()


if __name__ == "__main__":
    main()
