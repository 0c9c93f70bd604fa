/** A sandbox's effective policy as the server applies it: network, host rules in order, secrets by name. */
import type { SandboxInfo } from "@bothy/protocol";

export function PolicyView({ info }: { info: SandboxInfo }) {
  const { network, policy } = info;
  return (
    <section aria-labelledby="policy-title">
      <h2 id="policy-title">Policy</h2>
      <p>
        {network == null || !network.enabled
          ? "No network: the server runs without networking."
          : network.internet
            ? "Internet: on."
            : "Internet: off."}
        {network?.enabled && network.allow_out.length > 0 && ` Also reaches ${network.allow_out.join(", ")}.`}
      </p>
      {policy == null ? (
        <p>No host policy: its HTTP(S) goes out directly.</p>
      ) : (
        <>
          <table class="rules">
            <thead>
              <tr>
                <th scope="col">Host</th>
                <th scope="col">Methods</th>
                <th scope="col">Action</th>
                <th scope="col">From</th>
              </tr>
            </thead>
            <tbody>
              {policy.rules.map((r) => (
                <tr key={`${r.source}#${r.index}`} data-rule={`${r.source}#${r.index}`}>
                  <td>{r.host}</td>
                  <td>{r.methods?.join(" ") ?? "any"}</td>
                  <td>{r.action}</td>
                  <td>
                    {r.source}#{r.index}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <p>
            Otherwise: {policy.default}. Secrets: {policy.secrets.length > 0 ? policy.secrets.join(", ") : "none"}.
          </p>
        </>
      )}
    </section>
  );
}
