import type { Readable, Writable } from "node:stream";
import type { CleanupStack } from "../util/cleanup-stack.ts";

/** What a driver needs to make one sandbox. */
export interface SandboxSpec {
  id: string;
  /**
   * The template's root, shared read-only by every sandbox of that template: its top layer,
   * which stands for its whole chain (`lowerDirsOf` in images/layer-store.ts reads the chain).
   */
  templateRoot: string;
  templateEnv: Record<string, string>;
  /**
   * Variables every command gets on top of the guest's own (a command's own env wins): the
   * egress CA bundle's paths and the sandbox's secret placeholders. Set on each new agent client.
   */
  commandEnv?: Record<string, string>;
  /** The egress gateway's CA certificate (PEM), installed in the guest's trust store on each boot. */
  egressCa?: string;
  vcpu: number;
  memoryMib: number;
  /**
   * How much the sandbox may write beyond its template: gVisor's upper layer lives on a file
   * system of this size; a VM's disk is the template's image grown by this much.
   */
  diskMib?: number;
  /** At most this many processes (threads included) under the sandbox's commands. */
  maxProcesses: number;
  /** A directory the sandbox owns; everything the driver makes on disk lives under it. */
  dir: string;
  /** What the sandbox may reach (network/); absent: the server's default posture. */
  egress?: EgressPolicy;
  /** The sandbox's network, made by network/ before start; absent: no network at all. */
  network?: GuestNetwork;
  /**
   * Start on the disk a stopped sandbox left in `dir` (same files, fresh processes) instead of
   * a new one; a QEMU sandbox paused before a restart comes back from its saved memory.
   */
  reuseDisk?: boolean;
  /**
   * With `reuseDisk`: start from the memory a pause saved in `dir` (the boot pipeline's `wake`,
   * set when the driver's `savedMemory` says there is one). Without it a kept disk boots cold and
   * any memory a pause left is dropped.
   */
  fromMemory?: boolean;
  /**
   * Booted ahead of demand (the warm pool): the sandbox gets the host's lowest CPU weight until
   * `prioritize`, so a refill booting beside live sandboxes never slows them (where the driver can).
   */
  background?: boolean;
  /**
   * The sandbox still runs from before a server restart: connect to it instead of starting it
   * (drivers with `attaches`); its agent is asked to say hello again.
   */
  attach?: boolean;
  /** Volumes mounted in the guest (volumes/); the driver has `volumeHost` make them ready first. */
  volumes?: readonly VolumeAttachment[];
  volumeHost?: VolumeHost;
}

/**
 * One volume of a sandbox, shown at `guestPath`: gVisor binds `hostDir`, where the host mounts the
 * volume's file system; a VM gets `image` itself as a disk.
 */
export interface VolumeAttachment {
  volumeId: string;
  hostDir: string;
  image: string;
  guestPath: string;
  readOnly: boolean;
}

/** Mounts volumes on the host while sandboxes use them (volumes/volume-mounts.ts). */
export interface VolumeHost {
  acquire(sandboxId: string, volumeIds: readonly string[]): Promise<void>;
  /** Safe to call again, and for a sandbox that holds nothing. */
  release(sandboxId: string): Promise<void>;
  /**
   * Makes sure the host's kernel has none of these volumes mounted, before a VM opens their images
   * itself (two file systems on one image would corrupt it); refuses one a sandbox still holds.
   */
  unmountForVm(volumeIds: readonly string[]): Promise<void>;
}

/** A volume as a VM guest mounts it: the disk with `serial`, at `path`. */
export interface GuestVolume {
  serial: string;
  path: string;
  readOnly: boolean;
}

/** Per-sandbox egress options of a create; see network/nft-ruleset.ts for how they apply. */
export interface EgressPolicy {
  internet: boolean;
  allowOut: string[];
  denyOut: string[];
  /** Its TCP 80 and 443 pass the egress gateway (it has a host policy, its own or its tenant's). */
  gateway?: boolean;
}

/** One sandbox's link to the host: a /30 between the host's end (gateway) and the guest. */
export interface GuestNetwork {
  guest: string;
  gateway: string;
  prefix: number;
  dns: string[];
  /** gVisor: the network namespace (name under /run/netns) whose interface runsc takes over. */
  netns?: string;
  /** VMs: the tap device the VM's virtio-net is backed by. */
  tap?: string;
}

/** The byte stream to the guest agent. */
export interface GuestStream {
  input: Readable;
  output: Writable;
  /**
   * The agent on the other end was already running (a restored VM): the host asks it to say
   * hello again instead of waiting for the hello of a fresh start.
   */
  resync?: boolean;
}

export interface ExitInfo {
  code: number | null;
  signal: string | null;
}

/**
 * One sandbox on the host. `start` runs once and never cleans up after itself: right after making
 * each host object (directory, mount, process, cgroup, socket, link) it pushes how to remove it
 * onto the boot's `CleanupStack`, which runs those undos on a failure and forgets them on success;
 * `wait` is shared by every caller; `shutdown` asks the guest to stop, `kill` does not ask; `stop`
 * ends it and removes every host object but its disk; `destroy` removes every host object the
 * sandbox has. Both are safe to call again.
 */
export interface SandboxHandle {
  readonly id: string;
  /**
   * `hostReady`: host work made for this sandbox at the same time as the start (its network's
   * plumb), which the guest's runtime needs: the driver awaits it right before it spawns runsc or
   * QEMU, and a rejection fails the start with that error. Whoever passes it pushed its undo first.
   */
  start(undo: CleanupStack, signal?: AbortSignal, hostReady?: Promise<void>): Promise<GuestStream>;
  wait(): Promise<ExitInfo>;
  shutdown(timeoutMs: number): Promise<void>;
  kill(): Promise<void>;
  stop(): Promise<void>;
  destroy(): Promise<void>;
  /** The guest learns its id, hostname, env, clock and entropy over the channel after hello. */
  readonly needsIdentity?: boolean;
  /** A `background` sandbox now serves a caller: it gets the host's default CPU weight back. */
  prioritize?(): Promise<void>;
  /** Saves the sandbox's memory to disk and ends its VM; absent where the driver cannot. */
  pause?(): Promise<void>;
  /**
   * Brings a paused sandbox back, pushing what it makes onto `undo` like `start`; a failed resume
   * leaves it paused. Its agent then needs a resync handshake.
   */
  resume?(undo: CleanupStack, signal?: AbortSignal): Promise<GuestStream>;
  /** The guest's network, when the guest configures it itself over the channel after identity (VMs). */
  readonly guestNetwork?: GuestNetwork;
  /** VMs: the volumes the guest mounts itself over the channel after its limits (gVisor's runsc binds them). */
  readonly guestVolumes?: readonly GuestVolume[];
  /** VMs: the size the host made the guest's disk; the guest grows its root file system to it. */
  readonly guestRootBytes?: number;
  /** What the driver saw of the guest (runsc's log, the console's last lines), for the log when a boot fails. */
  readonly diagnostics: string | undefined;
  /** How long the phases of `start` took (ms), by name (disk, overlay, network, …), for profiling. */
  readonly startSteps?: Readonly<Record<string, number>>;
}

/** A host object that exists for a sandbox: found by `reconcile`, removable without a handle. */
export interface HostObject {
  sandboxId: string;
  kind: string;
  description: string;
  /** The sandbox's disk (its files): kept while the sandbox is stopped or paused. */
  disk?: boolean;
}

/** Guests under software emulation (QEMU's TCG) boot several times slower: they get this many boot timeouts. */
const EMULATED_BOOT_FACTOR = 3;

/** How long a guest of a driver with this acceleration may take to say hello. */
export function bootTimeoutMs(acceleration: string, baseMs: number): number {
  return acceleration === "tcg" ? baseMs * EMULATED_BOOT_FACTOR : baseMs;
}

export interface Driver {
  readonly name: string;
  /** Whether its sandboxes outlive the server's process, so a restarted server can attach to them. */
  readonly attaches: boolean;
  /** How guests run: "ptrace" (gVisor's platform), "kvm" or "tcg" (QEMU). */
  readonly acceleration: string;
  /** Checks the host can run this driver; throws a BothyError saying what to install or fix. */
  preflight(): Promise<void>;
  create(spec: SandboxSpec): SandboxHandle;
  /** Whether a pause left this sandbox's memory in its directory (a start on its kept disk can restore it); absent: never. */
  savedMemory?(spec: SandboxSpec): boolean;
  /** Every host object this driver's sandboxes hold, whether or not a handle exists for them. */
  reconcile(): Promise<HostObject[]>;
  /** Removes all host objects of a sandbox that has no live handle. */
  removeOrphan(sandboxId: string): Promise<void>;
  /** Removes every host object of a sandbox that has no live handle except its disk. */
  release(sandboxId: string): Promise<void>;
  /**
   * Copies what the sandbox wrote over its template (an overlayfs upper directory, whiteouts
   * included) to `dest`, a path that must not exist yet: a running sandbox is frozen for the copy
   * only, a stopped one's disk is read in place. Absent where the driver cannot (snapshots: 501).
   */
  captureFiles?(sandbox: { id: string; dir: string; running: boolean }, dest: string): Promise<{ frozenMs: number }>;
  /**
   * A VM's snapshot (instead of `captureFiles`): its disk frozen into a read-only image over the
   * disk of `baseRoot` (the layer the snapshot lies over) and, with `memory`, its memory and
   * devices, written as files into `out` (an existing, empty directory), which the caller moves
   * beside the snapshot layer's (empty) tree. `handle`: the sandbox runs, and is stopped for the
   * copy only. Returns the files written and how long the sandbox was frozen.
   */
  captureImage?(
    sandbox: { id: string; dir: string; handle?: SandboxHandle },
    baseRoot: string,
    out: string,
    memory: boolean,
  ): Promise<{ frozenMs: number; files: string[] }>;
}
