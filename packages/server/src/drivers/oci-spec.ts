import { createHash } from "node:crypto";
import { dirname, join } from "node:path";
import type { SandboxSpec } from "./driver.ts";
import { HOST_PIDS_BACKSTOP } from "./host-cgroups.ts";

/** Where the agent appears inside every sandbox. */
export const GUEST_AGENT_PATH = "/opt/bothy/agent.mjs";

/** Where the host's Node appears when it runs the agent (`agentNode`). */
export const GUEST_AGENT_NODE_PATH = "/opt/bothy/node";
/** The template's own Node: runs the agent when no `agentNode` is given, or when it cannot run. */
const TEMPLATE_NODE_PATH = "/usr/bin/node";
/** Where the agent's startup snapshot appears (`agentSnapshot`). */
const GUEST_AGENT_SNAPSHOT_PATH = "/opt/bothy/agent.blob";
/** The agent as one script, beside the agent bundle, that `agentNode` builds the snapshot from (agent-snapshot.ts). */
export const AGENT_SNAPSHOT_SCRIPT = "agent-snapshot.cjs";

/** Files built beside the agent bundle and bind-mounted into gVisor sandboxes. */
export const GVISOR_COMPAT_FILES = [
  { name: "statx-compat.so", guestPath: "/opt/bothy/statx-compat.so" },
  { name: "ld.so.preload", guestPath: "/etc/ld.so.preload" },
  { name: "bothy-init", guestPath: "/opt/bothy/bothy-init" },
  // The agent's helper: it starts commands far faster than Node can in gVisor (native/spawner.c).
  { name: "bothy-helper", guestPath: "/opt/bothy/bothy-helper" },
];

const CPU_PERIOD_US = 100_000;
/** cgroup v1's lowest `cpu.shares` (runsc maps it to cgroup v2's `cpu.weight`): a `background` sandbox's weight. */
export const BACKGROUND_CPU_SHARES = 2;

/** Docker's default set: enough for a root user to install packages and manage files. */
const CAPABILITIES = [
  "CAP_CHOWN",
  "CAP_DAC_OVERRIDE",
  "CAP_FSETID",
  "CAP_FOWNER",
  "CAP_MKNOD",
  "CAP_NET_RAW",
  "CAP_SETGID",
  "CAP_SETUID",
  "CAP_SETFCAP",
  "CAP_SETPCAP",
  "CAP_NET_BIND_SERVICE",
  "CAP_SYS_CHROOT",
  "CAP_KILL",
  "CAP_AUDIT_WRITE",
  // Only for bothy-init (PID 1), to mount the commands' pids cgroup: it drops this from every
  // set, bounding set included, before it starts the agent, so no command ever holds it.
  "CAP_SYS_ADMIN",
];

/**
 * The OCI runtime spec of one sandbox: the agent as the only process, talking over stdio. With
 * `hostLimits`, runsc puts the sandbox in the cgroup `cgroupsPath` with its CPU quota, memory and
 * a pids backstop, on either cgroup layout; without (an operator's opt-out on a host that cannot
 * limit), it gets no cgroup of its own.
 */
export function buildOciSpec(
  spec: SandboxSpec & {
    rootfs: string;
    agentPath: string;
    /**
     * A Node on the host to run the agent with, bind-mounted read-only (config.ts agentNode): one
     * built with a startup snapshot and code cache starts the agent ~0.3 s sooner under gVisor
     * than Debian's Node 18, which has neither. bothy-init falls back to the template's Node
     * where its libraries do not fit.
     */
    agentNode?: string;
    /** That Node's startup snapshot of the agent (agent-snapshot.ts): it starts from it instead of the script. */
    agentSnapshot?: string;
    /** `lazy`: bothy-init's native front answers the boot and starts the agent on first use; `boot`: `--no-front`. */
    agentStart: "boot" | "lazy";
    cgroupsPath: string;
    resolvConf?: string;
    /** The sandbox's own /etc/machine-id (`machineIdOf`), bound read-only over the template's. */
    machineIdFile?: string;
    hostLimits: boolean;
  },
): object {
  const env = {
    PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    HOME: "/root",
    TERM: "xterm",
    LANG: "C.UTF-8",
    ...spec.templateEnv,
    HOSTNAME: spec.id,
    BOTHY_SANDBOX_ID: spec.id,
  };
  return {
    ociVersion: "1.0.2",
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      // A small init as PID 1 reaps orphaned processes, which Node cannot do.
      args: ["/opt/bothy/bothy-init", ...(spec.agentStart === "lazy" ? [] : ["--no-front"]), ...agentCommand(spec)],
      env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
      cwd: "/",
      capabilities: Object.fromEntries(
        ["bounding", "effective", "inheritable", "permitted"].map((k) => [k, CAPABILITIES]),
      ),
      rlimits: [{ type: "RLIMIT_NOFILE", hard: 1_048_576, soft: 1_048_576 }],
    },
    root: { path: spec.rootfs, readonly: false },
    hostname: spec.id,
    mounts: [
      { destination: "/proc", type: "proc", source: "proc" },
      { destination: "/dev", type: "tmpfs", source: "tmpfs" },
      { destination: "/sys", type: "sysfs", source: "sysfs", options: ["nosuid", "noexec", "nodev", "ro"] },
      { destination: GUEST_AGENT_PATH, type: "bind", source: spec.agentPath, options: ["rbind", "ro"] },
      ...(spec.agentNode === undefined
        ? []
        : [{ destination: GUEST_AGENT_NODE_PATH, type: "bind", source: spec.agentNode, options: ["rbind", "ro"] }]),
      ...(spec.agentNode === undefined || spec.agentSnapshot === undefined
        ? []
        : [
            {
              destination: GUEST_AGENT_SNAPSHOT_PATH,
              type: "bind",
              source: spec.agentSnapshot,
              options: ["rbind", "ro"],
            },
          ]),
      // runsc 2022-12 refuses statx's AT_NO_AUTOMOUNT, which coreutils always passes (`ls -l`
      // and `stat` fail with EINVAL); a preloaded shim drops the flag. See statx-compat.c.
      ...GVISOR_COMPAT_FILES.map((f) => ({
        destination: f.guestPath,
        type: "bind",
        source: join(dirname(spec.agentPath), f.name),
        options: ["rbind", "ro"],
      })),
      // The public resolvers bothy names (network/): the template's own resolv.conf is the build host's.
      ...(spec.resolvConf === undefined
        ? []
        : [{ destination: "/etc/resolv.conf", type: "bind", source: spec.resolvConf, options: ["rbind", "ro"] }]),
      ...(spec.machineIdFile === undefined
        ? []
        : [{ destination: "/etc/machine-id", type: "bind", source: spec.machineIdFile, options: ["rbind", "ro"] }]),
      // Volumes: the host mount of each (volumes/volume-mounts.ts), read-only for a reader.
      ...(spec.volumes ?? []).map((v) => ({
        destination: v.guestPath,
        type: "bind",
        source: v.hostDir,
        options: ["rbind", "nosuid", "nodev", v.readOnly ? "ro" : "rw"],
      })),
    ],
    linux: {
      ...(spec.hostLimits
        ? {
            cgroupsPath: spec.cgroupsPath,
            resources: {
              cpu: {
                quota: Math.round(spec.vcpu * CPU_PERIOD_US),
                period: CPU_PERIOD_US,
                ...(spec.background ? { shares: BACKGROUND_CPU_SHARES } : {}),
              },
              memory: { limit: spec.memoryMib * 1024 * 1024 },
              pids: { limit: HOST_PIDS_BACKSTOP },
            },
          }
        : {}),
      // With a network, the sandbox joins the namespace network/ made, and gVisor takes over its eth0.
      namespaces: [
        { type: "pid" },
        spec.network?.netns ? { type: "network", path: `/run/netns/${spec.network.netns}` } : { type: "network" },
        { type: "ipc" },
        { type: "uts" },
        { type: "mount" },
      ],
    },
  };
}

/**
 * bothy-init's arguments: the agent on the template's Node; or on the host's (from its snapshot
 * when there is one), with the template's as the fallback where the host's cannot run.
 */
function agentCommand(spec: { agentNode?: string; agentSnapshot?: string }): string[] {
  const onTemplateNode = [TEMPLATE_NODE_PATH, GUEST_AGENT_PATH];
  if (spec.agentNode === undefined) return onTemplateNode;
  const onHostNode =
    spec.agentSnapshot === undefined
      ? [GUEST_AGENT_NODE_PATH, GUEST_AGENT_PATH]
      : [GUEST_AGENT_NODE_PATH, "--snapshot-blob", GUEST_AGENT_SNAPSHOT_PATH];
  return ["--fallback", ...onTemplateNode, "--", ...onHostNode];
}

/**
 * A sandbox's machine id, 32 hex digits derived from its id: stable across its restarts, different
 * in every sandbox, sandboxes started from one snapshot included (the guest agent derives a VM's
 * the same way, packages/guest/src/identity.ts).
 */
export function machineIdOf(sandboxId: string): string {
  return createHash("sha256").update(`bothy-machine-id:${sandboxId}`).digest("hex").slice(0, 32);
}
