/**
 * One sandbox: its facts and lifecycle buttons, a live terminal, its commands (run in the
 * background, re-attach, kill), its files, its desktop's live view, its ports as links, its
 * effective policy and its audit.
 */
import type { SandboxInfo } from "@bothy/protocol";
import { useEffect, useState } from "preact/hooks";
import { ApiError, getJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { AuditLog } from "../components/audit-log.tsx";
import { CommandsPanel } from "../components/commands-panel.tsx";
import { DesktopView } from "../components/desktop-view.tsx";
import { FileBrowser } from "../components/file-browser.tsx";
import { PolicyView } from "../components/policy-view.tsx";
import { PortLinks } from "../components/port-links.tsx";
import { SandboxControls } from "../components/sandbox-controls.tsx";
import { TerminalView } from "../components/terminal.tsx";
import { onEvents } from "../events.ts";
import { href } from "../router.ts";

export function SandboxPage({ route, can }: PageProps) {
  const id = route.rest[0] ?? "";
  const [info, setInfo] = useState<SandboxInfo | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    const load = (): void => {
      getJson<SandboxInfo>(`/sandboxes/${encodeURIComponent(id)}`)
        .then(setInfo)
        .catch((err: unknown) => setError(err instanceof ApiError ? err.message : String(err)));
    };
    load();
    return onEvents(["sandbox.deleted", "sandbox.failed", "sandbox.stopped", "sandbox.woken"], (_type, data) => {
      if ((data as { sandbox_id?: string }).sandbox_id === id) load();
    });
  }, [id]);
  if (error !== null)
    return (
      <p role="alert" class="error">
        {error} <a href={href("sandboxes")}>Back to the list</a>
      </p>
    );
  if (info === null) return <p>Loading…</p>;
  return (
    <>
      <h1>{info.sandbox_id}</h1>
      <dl class="facts">
        <dt>State</dt>
        <dd>{info.state}</dd>
        <dt>Template</dt>
        <dd>{info.template}</dd>
        <dt>Driver</dt>
        <dd>{info.driver}</dd>
        <dt>Size</dt>
        <dd>
          {info.vcpu} vCPU · {info.memory_mib} MiB
        </dd>
        <dt>Expires</dt>
        <dd data-fact="expires">{info.expires_at ?? "never"}</dd>
      </dl>
      {can("sandboxes:write") && <SandboxControls info={info} onChanged={setInfo} />}
      {info.state === "running" && can("sandboxes:write") && <TerminalView sandboxId={id} writable />}
      <CommandsPanel sandboxId={id} writable={info.state === "running" && can("sandboxes:write")} />
      {info.state === "running" && can("files") && <FileBrowser sandboxId={id} writable={can("files")} />}
      {info.state === "running" && (
        <DesktopView sandboxId={id} template={info.template} writable={can("sandboxes:write")} />
      )}
      {info.state === "running" && <PortLinks sandboxId={id} writable={can("sandboxes:write")} />}
      <PolicyView info={info} />
      <AuditLog sandboxId={id} />
    </>
  );
}
