/**
 * `bothy doctor`: checks this host for what bothy's drivers and network need, and says what to
 * fix. It reads the host only (PATH, /proc, cgroups, /dev/kvm, free space); with a server running it also
 * asks its /healthz.
 */
import { execFile } from "node:child_process";
import { access, constants, open, readdir, readFile, statfs } from "node:fs/promises";
import { delimiter, join } from "node:path";
import { promisify } from "node:util";
import { JSON_FLAG, parse } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { formatBytes } from "../byte-progress.ts";
import { printJson } from "../output.ts";

const pexec = promisify(execFile);

const USAGE = `usage: bothy doctor [--json]

Checks this host for bothy: runsc (gVisor), QEMU and its guest kernel, the cgroup layout
(whether each driver's sandboxes get their CPU, memory and pids limits), KVM, nftables,
IPv4 forwarding, free disk space under BOTHY_HOME, and whether a server answers at BOTHY_URL.
Each problem comes with the fix. Exit status 1 when something required is missing.
`;

export type CheckStatus = "ok" | "warn" | "fail";

export interface Check {
  name: string;
  status: CheckStatus;
  detail: string;
  /** What to do about a warn or fail. */
  fix?: string;
}

async function onPath(program: string): Promise<string | undefined> {
  for (const dir of (process.env["PATH"] ?? "").split(delimiter)) {
    const candidate = join(dir, program);
    if (
      await access(candidate, constants.X_OK).then(
        () => true,
        () => false,
      )
    )
      return candidate;
  }
  return undefined;
}

async function firstLine(program: string, args: string[]): Promise<string> {
  try {
    const { stdout, stderr } = await pexec(program, args, { timeout: 10_000 });
    return (stdout || stderr).trim().split("\n")[0] ?? "";
  } catch (err) {
    return `failed: ${err instanceof Error ? err.message.split("\n")[0] : String(err)}`;
  }
}

async function runsc(): Promise<Check> {
  const path = await onPath("runsc");
  if (!path)
    return {
      name: "runsc",
      status: "fail",
      detail: "not found on PATH; the gVisor driver (the default without KVM) needs it",
      fix: "./scripts/install-deps, or apt-get install runsc from gVisor's apt repository",
    };
  return { name: "runsc", status: "ok", detail: `${path}: ${await firstLine(path, ["--version"])}` };
}

async function qemu(): Promise<Check> {
  const missing = [];
  for (const p of ["qemu-system-x86_64", "qemu-img", "mkfs.ext4"]) if (!(await onPath(p))) missing.push(p);
  if (missing.length)
    return {
      name: "qemu",
      status: "warn",
      detail: `missing ${missing.join(", ")}; the QEMU driver is unavailable (gVisor still works)`,
      fix: "apt-get install qemu-system-x86 qemu-utils e2fsprogs",
    };
  return { name: "qemu", status: "ok", detail: await firstLine("qemu-system-x86_64", ["--version"]) };
}

async function guestKernel(): Promise<Check> {
  const home = process.env["BOTHY_HOME"] ?? "/var/lib/bothy";
  const dir = process.env["BOTHY_KERNEL_DIR"] ?? join(home, "kernel");
  const releases = await readdir(dir).catch(() => [] as string[]);
  for (const r of releases) {
    const boot = await readdir(join(dir, r, "boot")).catch(() => [] as string[]);
    const vmlinuz = boot.find((f) => f.startsWith("vmlinuz-"));
    if (vmlinuz) return { name: "guest kernel", status: "ok", detail: join(dir, r, "boot", vmlinuz) };
  }
  const apt = await onPath("apt-get");
  return {
    name: "guest kernel",
    status: "warn",
    detail: `none unpacked in ${dir}; the QEMU driver fetches linux-image-cloud-amd64 on first start${apt ? "" : ", but apt-get is missing"}`,
    fix: apt
      ? "nothing to do, or start bothy once with BOTHY_DRIVER=qemu to fetch it now"
      : "run bothy on Debian (it fetches the kernel with apt-get download), or set BOTHY_KERNEL_DIR to an unpacked one",
  };
}

async function hostKernel(): Promise<Check> {
  const release = (await readFile("/proc/sys/kernel/osrelease", "utf8").catch(() => "")).trim();
  const [major = 0, minor = 0] = release.split(".").map((n) => parseInt(n, 10));
  if (major < 5 || (major === 5 && minor < 10))
    return {
      name: "host kernel",
      status: "warn",
      detail: `${release || "unknown"}; bothy is tested on 5.10 or newer`,
      fix: "upgrade to Debian 12's kernel (6.1)",
    };
  return { name: "host kernel", status: "ok", detail: release };
}

/**
 * The cgroup checks use the server's own detection, which only a checkout has: an installed CLI
 * says it skipped them instead of failing to load.
 */
async function cgroups(): Promise<Check[]> {
  let mod: typeof import("./doctor-cgroups.ts");
  try {
    mod = await import("./doctor-cgroups.ts");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ERR_MODULE_NOT_FOUND") throw err;
    return [
      {
        name: "limits",
        status: "warn",
        detail: "not checked: the host's cgroup checks need the server's code (run doctor from a bothy checkout)",
      },
    ];
  }
  return mod.cgroupChecks(await mod.hostCgroupLayout(), process.env[mod.HOST_LIMITS_ENV]);
}

async function kvm(): Promise<Check> {
  const cpuinfo = await readFile("/proc/cpuinfo", "utf8").catch(() => "");
  const flag = /^flags\s*:.*\b(vmx|svm)\b/m.exec(cpuinfo)?.[1];
  let opens = false;
  let why = "";
  try {
    await (await open("/dev/kvm", "r+")).close();
    opens = true;
  } catch (err) {
    why = (err as NodeJS.ErrnoException).code ?? String(err);
  }
  if (flag && opens)
    return {
      name: "KVM",
      status: "ok",
      detail: `${flag} in the CPU flags and /dev/kvm opens: QEMU sandboxes run accelerated`,
    };
  const detail = !flag ? "no vmx/svm in the CPU flags (nested virtualization off?)" : `/dev/kvm does not open (${why})`;
  return {
    name: "KVM",
    status: "warn",
    detail: `${detail}; QEMU sandboxes run in software emulation (TCG, much slower)`,
    fix: !flag
      ? "enable nested virtualization on the VM host, or use gVisor (the default here)"
      : "modprobe kvm_intel (or kvm_amd) and run bothy as root",
  };
}

async function nft(): Promise<Check> {
  const path =
    (await onPath("nft")) ??
    (await access("/usr/sbin/nft").then(
      () => "/usr/sbin/nft",
      () => undefined,
    ));
  if (!path)
    return {
      name: "nftables",
      status: "warn",
      detail: "nft not found; sandboxes cannot get a filtered network",
      fix: "apt-get install nftables",
    };
  return { name: "nftables", status: "ok", detail: `${path}: ${await firstLine(path, ["--version"])}` };
}

async function ipForward(): Promise<Check> {
  const value = (await readFile("/proc/sys/net/ipv4/ip_forward", "utf8").catch(() => "")).trim();
  if (value === "1") return { name: "ip_forward", status: "ok", detail: "net.ipv4.ip_forward = 1" };
  return {
    name: "ip_forward",
    status: "warn",
    detail: `net.ipv4.ip_forward = ${value || "unknown"}; sandboxes with network cannot reach out`,
    fix: "sysctl -w net.ipv4.ip_forward=1 (and put it in /etc/sysctl.d/ to keep it)",
  };
}

async function disk(): Promise<Check> {
  const home = process.env["BOTHY_HOME"] ?? "/var/lib/bothy";
  // BOTHY_HOME may not exist yet: measure the nearest directory that does.
  let dir = home;
  for (;;) {
    if (
      await access(dir).then(
        () => true,
        () => false,
      )
    )
      break;
    const parent = dir.replace(/\/[^/]*\/?$/, "") || "/";
    if (parent === dir) break;
    dir = parent;
  }
  const s = await statfs(dir);
  const free = s.bavail * s.bsize;
  const text = `${formatBytes(free)} free at ${dir}${dir === home ? "" : ` (for ${home})`}`;
  if (free < 5 * 1024 ** 3)
    return {
      name: "disk space",
      status: "fail",
      detail: text,
      fix: "free space or point BOTHY_HOME at a bigger disk: a template takes ~1 GiB, each sandbox's writes come on top",
    };
  if (free < 20 * 1024 ** 3)
    return {
      name: "disk space",
      status: "warn",
      detail: text,
      fix: "20 GiB or more is comfortable for several templates and busy sandboxes",
    };
  return { name: "disk space", status: "ok", detail: text };
}

async function root(): Promise<Check> {
  if (process.getuid?.() === 0) return { name: "root", status: "ok", detail: "running as root" };
  return {
    name: "root",
    status: "warn",
    detail: "not root: bothy serve needs root for runsc, mounts, cgroups and nftables",
    fix: "run bothy serve as root",
  };
}

async function server(): Promise<Check> {
  const url = (process.env["BOTHY_URL"] ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
  try {
    const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(3000) });
    const body = (await res.json()) as { sandboxes?: Record<string, number> };
    return {
      name: "server",
      status: "ok",
      detail: `${url} answers; ${body.sandboxes?.["running"] ?? 0} sandboxes running`,
    };
  } catch {
    return {
      name: "server",
      status: "warn",
      detail: `nothing answers at ${url}`,
      fix: "start it with bothy serve (or npm start), or set BOTHY_URL",
    };
  }
}

export async function runChecks(): Promise<Check[]> {
  return Promise.all([
    root(),
    runsc(),
    qemu(),
    guestKernel(),
    hostKernel(),
    ...(await cgroups()),
    kvm(),
    nft(),
    ipForward(),
    disk(),
    server(),
  ]);
}

const MARK: Record<CheckStatus, string> = { ok: "ok  ", warn: "warn", fail: "FAIL" };

export const doctorCommand: Command = {
  name: "doctor",
  summary: "check this host for what bothy needs",
  usage: USAGE,
  async run(args) {
    const { values } = parse(
      args,
      { ...JSON_FLAG, help: { type: "boolean", short: "h" } },
      { min: 0, max: 0, names: "" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const checks = await runChecks();
    const failed = checks.some((c) => c.status === "fail");
    if (values.json) printJson({ ok: !failed, checks });
    else {
      const width = Math.max(...checks.map((c) => c.name.length));
      for (const c of checks) {
        process.stdout.write(`${MARK[c.status]}  ${c.name.padEnd(width)}  ${c.detail}\n`);
        if (c.fix) process.stdout.write(`      ${" ".repeat(width)}  fix: ${c.fix}\n`);
      }
      process.stdout.write(
        failed ? "\nbothy cannot run here until the FAIL lines are fixed.\n" : "\nbothy can run here.\n",
      );
    }
    return failed ? 1 : 0;
  },
};
