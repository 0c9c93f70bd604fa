"""The computer tools an agent's model may call, each on one bothy sandbox through the ``bothy``
SDK: run a command, read a file, write a file, view an image. Every result is plain JSON a model
can read (an image as base64 PNG); a failing command is a result, not an exception, so the model
sees the exit code and stderr and can try something else."""

import base64
from typing import Any, Dict

from bothy import Sandbox, SandboxError

#: The tools' descriptions in the JSON-schema form model APIs take (OpenAI ``tools``, Anthropic ``tools``).
TOOL_SPECS = [
    {
        "name": "run_command",
        "description": "Runs a shell command in the sandbox; answers its exit code, stdout and stderr.",
        "input_schema": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "timeout_s": {"type": "number"}},
            "required": ["cmd"],
        },
    },
    {
        "name": "read_file",
        "description": "Reads a text file of the sandbox.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "write_file",
        "description": "Writes a text file in the sandbox (its folder must exist).",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "view_image",
        "description": "Shows a PNG file of the sandbox; without a path, a screenshot of its desktop (template desktop).",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
]

#: Output past this many characters is cut (a model's context is finite).
MAX_OUTPUT_CHARS = 16_000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _cut(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return f"{text[:MAX_OUTPUT_CHARS]}\n[... {len(text) - MAX_OUTPUT_CHARS} more characters]"


def run_tool(sandbox: Sandbox, tool: str, args: Dict[str, Any]) -> Dict[str, Any]:
    """Runs one tool call; errors from the sandbox become a result the model reads."""
    try:
        if tool == "run_command":
            result = sandbox.commands.run(args["cmd"], timeout=args.get("timeout_s"), throw_on_error=False)
            return {
                "ok": True,
                "exit_code": result.exit_code,
                "stdout": _cut(result.stdout),
                "stderr": _cut(result.stderr),
            }
        if tool == "read_file":
            return {"ok": True, "content": _cut(sandbox.files.read(args["path"]))}
        if tool == "write_file":
            sandbox.files.write(args["path"], args["content"])
            return {"ok": True, "path": args["path"]}
        if tool == "view_image":
            path = args.get("path")
            png = sandbox.desktop.screenshot().png if path is None else sandbox.files.read_bytes(path)
            if not png.startswith(PNG_SIGNATURE):
                return {"ok": False, "error": f"{path or 'the screenshot'} is not a PNG file"}
            return {"ok": True, "media_type": "image/png", "base64": base64.b64encode(png).decode("ascii")}
        return {"ok": False, "error": f"no tool {tool!r}; the tools are {[t['name'] for t in TOOL_SPECS]}"}
    except (SandboxError, KeyError) as err:
        return {"ok": False, "error": str(err)}
