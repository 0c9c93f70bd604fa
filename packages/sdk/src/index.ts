export {
  Sandbox,
  type SandboxCreateOptions,
  type ForkOptions,
  type SandboxOptions,
  type KillOptions,
  type SandboxInfo,
  type SandboxState,
  type DriverName,
} from "./sandbox.ts";
export {
  Commands,
  CommandHandle,
  type CommandOptions,
  type ExecOptions,
  type ExecResult,
  type RunOptions,
  type BackgroundOptions,
  type ConnectOptions,
  type CommandInfo,
  type SignalName,
} from "./commands.ts";
export { Ports, type ListeningPort, type ForwardOptions, type PortForward } from "./ports.ts";
export {
  Desktop,
  type DesktopAction,
  type DesktopActionResult,
  type DesktopInfo,
  type LinkOptions,
  type LinkResponse,
  type MouseButton,
  type Screenshot,
} from "./desktop.ts";
export { Pty, DEFAULT_PTY_COMMAND, type PtyOptions } from "./pty.ts";
export {
  Files,
  type EntryInfo,
  type FileInfo,
  type FileType,
  type WriteData,
  type WriteInfo,
  type WriteOptions,
} from "./files.ts";
export { type BothyEvent, type EventOptions } from "./events.ts";
export { DEFAULT_BASE_URL, type CallOptions, type ConnectionOptions } from "./http-client.ts";
export {
  SandboxError,
  NotFoundError,
  InvalidArgumentError,
  ConflictError,
  TimeoutError,
  RateLimitError,
  AuthenticationError,
  NotSupportedError,
  ConnectionError,
  CommandExitError,
  CommandTimeoutError,
  errorFromCode,
  errorFromProblem,
  type CommandResult,
  type SandboxErrorOptions,
} from "./errors.ts";
export {
  ApiKeys,
  Nodes,
  Tenants,
  type AdminOptions,
  type ApiKeyInfo,
  type NodeInfo,
  type CreatedKey,
  type KeyCreateOptions,
  type TenantInfo,
  type TenantQuota,
} from "./admin.ts";
export { UiLinks, type UiLink, type UiLinkOptions } from "./ui-links.ts";
export { Secrets, type SecretInfo, type SecretOptions, type SecretPutOptions } from "./secrets.ts";
export {
  Approvals,
  type ApprovalInfo,
  type ApprovalState,
  type ApprovalListOptions,
  type ApproveOptions,
  type DenyOptions,
} from "./approvals.ts";
export { TenantPolicy, type PolicyOptions, type HostPolicyRequest, type TenantPolicyInfo } from "./policy.ts";
export { Volume, type VolumeInfo, type VolumeOptions } from "./volume.ts";
export { Snapshot, type SnapshotInfo, type SnapshotOptions } from "./snapshot.ts";
