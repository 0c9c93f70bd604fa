import { describe, expect, it } from "vitest";
import { formatBytes, renderBar } from "../src/byte-progress.ts";
import { commandLine, exitStatus } from "../src/commands/exec.ts";
import { CONNECTION_FLAGS, JSON_FLAG, parse, UsageError } from "../src/args/parse.ts";

describe("exec helpers", () => {
  it("passes one word through as a shell line and quotes several", () => {
    expect(commandLine(["ls | wc -l"])).toBe("ls | wc -l");
    expect(commandLine(["printf", "%s", "a b", "it's", "$HOME"])).toBe(`printf %s 'a b' 'it'\\''s' '$HOME'`);
  });

  it("exits like a shell: the code, or 128 + the signal number", () => {
    expect(exitStatus(0, undefined)).toBe(0);
    expect(exitStatus(7, undefined)).toBe(7);
    expect(exitStatus(null, "SIGKILL")).toBe(137);
    expect(exitStatus(null, "SIGTERM")).toBe(143);
    expect(exitStatus(null, undefined)).toBe(1);
  });
});

describe("byte progress", () => {
  it("formats sizes and draws a bar within the width", () => {
    expect(formatBytes(512)).toBe("512 B");
    expect(formatBytes(3 * 1024 * 1024)).toBe("3.0 MiB");
    const line = renderBar("blob.bin", 1024 * 1024, 4 * 1024 * 1024, 1000, 79);
    expect(line).toMatch(/^blob\.bin \[#+\.+\] 25% {2}1\.0 MiB\/4\.0 MiB {2}1\.0 MiB\/s$/);
    expect(line.length).toBeLessThanOrEqual(79);
    expect(renderBar("stdin", 2048, undefined, 1000, 79)).toBe("stdin  2.0 KiB  2.0 KiB/s");
  });
});

describe("argument parsing (commander)", () => {
  const options = {
    ...CONNECTION_FLAGS,
    ...JSON_FLAG,
    env: { type: "string", short: "e", multiple: true },
    "no-internet": { type: "boolean" },
    stdin: { type: "boolean", short: "i" },
    timeout: { type: "string" },
  } as const;
  const one = { min: 1, max: 1, names: "sandbox ID" };

  it("takes options anywhere, repeatable ones as lists, --no-X as a flag of its own", () => {
    expect(parse(["-i", "sbx", "--json", "-e", "A=1", "--env=B=2", "--no-internet"], options, one)).toEqual({
      values: { stdin: true, json: true, env: ["A=1", "B=2"], "no-internet": true },
      positionals: ["sbx"],
    });
    expect(parse(["-", "--", "-x"], options, { min: 0, max: 2, names: "x" }).positionals).toEqual(["-", "-x"]);
  });

  it("refuses unknown options, a missing value and a wrong count of arguments as usage errors", () => {
    for (const [args, message] of [
      [["sbx", "--bogus"], "Unknown option '--bogus'"],
      [["sbx", "--timeout"], "Option '--timeout <value>' argument missing"],
      [[], "missing sandbox ID"],
      [["a", "b"], "unexpected argument b"],
    ] as const)
      expect(() => parse([...args], options, one)).toThrow(new UsageError(message));
    // --help needs no arguments.
    expect(parse(["--help"], options, one).values.help).toBe(true);
  });
});
