/** What the cluster's leases tell the operator: an event name and its fields, at a level. */
export type ClusterLog = (
  level: "info" | "warn" | "error",
  event: ClusterEvent,
  fields: Record<string, string | number | undefined>,
) => void;

export type ClusterEvent =
  | "node_lease_waiting"
  | "node_lease_acquired"
  | "node_lease_lost"
  | "node_lease_failed"
  | "leader_acquired"
  | "leader_lost"
  | "leader_failed"
  | "leader_job_failed"
  | "leader_job_refused";

export const quiet: ClusterLog = () => undefined;

/** A failure's message for the log (never a database URL: pg's errors do not carry it). */
export function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
