/**
 * The deployment files under deploy/, checked offline: every Kubernetes manifest against the
 * Kubernetes API's JSON schemas (kubernetes-models validates each object with them), and against
 * each other (the Secret's keys the DaemonSet reads, the selectors of the Service and the
 * PodDisruptionBudget, the host paths a node needs, the variables the server reads); the systemd
 * unit with `systemd-analyze verify`.
 */
import { execFile } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { DaemonSet } from "kubernetes-models/apps/v1/DaemonSet";
import { ConfigMap } from "kubernetes-models/v1/ConfigMap";
import { Namespace } from "kubernetes-models/v1/Namespace";
import { Secret } from "kubernetes-models/v1/Secret";
import { Service } from "kubernetes-models/v1/Service";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1/PodDisruptionBudget";
import { describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";

const DEPLOY = fileURLToPath(new URL("../../../deploy/", import.meta.url));
const KUBERNETES = join(DEPLOY, "kubernetes");

/** The API objects the manifests may hold, by `apiVersion/kind`, each with its schema's validator. */
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  "v1/Namespace": Namespace,
  "v1/ConfigMap": ConfigMap,
  "v1/Secret": Secret,
  "v1/Service": Service,
  "apps/v1/DaemonSet": DaemonSet,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
};

interface Manifest {
  file: string;
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  [key: string]: unknown;
}

function manifests(): Manifest[] {
  const out: Manifest[] = [];
  for (const file of readdirSync(KUBERNETES).filter((f) => f.endsWith(".yaml"))) {
    if (file === "kustomization.yaml") continue;
    for (const doc of parseAllDocuments(readFileSync(join(KUBERNETES, file), "utf8"))) {
      expect(doc.errors, file).toEqual([]);
      out.push({ ...(doc.toJS() as Manifest), file });
    }
  }
  return out;
}

const one = <T>(all: Manifest[], kind: string): T => {
  const found = all.filter((m) => m.kind === kind);
  expect(found, kind).toHaveLength(1);
  return found[0] as T;
};

describe("deploy/kubernetes", () => {
  it("every manifest is a valid object of the Kubernetes API (its JSON schema), in the bothy namespace", () => {
    const all = manifests();
    expect(all.map((m) => m.kind).sort()).toEqual([
      "ConfigMap",
      "DaemonSet",
      "Namespace",
      "PodDisruptionBudget",
      "Secret",
      "Service",
    ]);
    for (const m of all) {
      const Model = MODELS[`${m.apiVersion}/${m.kind}`];
      expect(Model, `${m.file}: ${m.apiVersion} ${m.kind} is not one the test knows`).toBeDefined();
      const { file, ...object } = m;
      expect(() => new Model!(object as never).validate(), file).not.toThrow();
      if (m.kind !== "Namespace") expect(m.metadata.namespace, file).toBe("bothy");
    }
  });

  it("the schema check catches a wrong field type (the validator is real)", () => {
    const all = manifests();
    const ds = structuredClone(one<Manifest>(all, "DaemonSet"));
    const { file: _file, ...object } = ds;
    const spec = object["spec"] as {
      template: { spec: { containers: Array<{ ports: Array<{ containerPort: unknown }> }> } };
    };
    spec.template.spec.containers[0]!.ports[0]!.containerPort = "eighty";
    expect(() => new DaemonSet(object as never).validate()).toThrow(/containerPort/);
  });

  it("the kustomization lists every manifest but the Secret, which a person makes with their own values", () => {
    const kustomization = parseAllDocuments(
      readFileSync(join(KUBERNETES, "kustomization.yaml"), "utf8"),
    )[0]?.toJS() as {
      resources: string[];
    };
    const files = [...new Set(manifests().map((m) => m.file))].filter((f) => f !== "secret.yaml").sort();
    expect([...kustomization.resources].sort()).toEqual(files);
  });

  it("the node DaemonSet: privileged on the host's network, the host paths a node needs, its variables from the ConfigMap and Secret", () => {
    const all = manifests();
    const ds = one<{
      spec: {
        selector: { matchLabels: Record<string, string> };
        template: {
          metadata: { labels: Record<string, string> };
          spec: {
            hostNetwork: boolean;
            automountServiceAccountToken: boolean;
            containers: Array<{
              securityContext: { privileged: boolean };
              env: Array<{
                name: string;
                value?: string;
                valueFrom?: { secretKeyRef?: { name: string; key: string } };
              }>;
              envFrom: Array<{ configMapRef: { name: string } }>;
              volumeMounts: Array<{ name: string; mountPath: string }>;
            }>;
            volumes: Array<{
              name: string;
              hostPath?: { path: string };
              secret?: { secretName: string; items: Array<{ key: string; path: string }> };
            }>;
          };
        };
      };
    }>(all, "DaemonSet");
    const pod = ds.spec.template.spec;
    const [node] = pod.containers;
    expect(node?.securityContext.privileged).toBe(true);
    expect(pod.hostNetwork).toBe(true);
    // A sandbox's code that reached the host side must find no Kubernetes credential there.
    expect(pod.automountServiceAccountToken).toBe(false);
    const hostPaths = pod.volumes.flatMap((v) => (v.hostPath ? [v.hostPath.path] : []));
    for (const path of [
      "/var/lib/bothy",
      "/dev/kvm",
      "/dev/net/tun",
      "/sys/fs/cgroup",
      "/usr/bin/runsc",
      "/var/run/netns",
    ])
      expect(hostPaths).toContain(path);
    const mounted = new Set(node?.volumeMounts.map((m) => m.name));
    for (const v of pod.volumes.filter((v) => v.hostPath)) expect(mounted.has(v.name), v.name).toBe(true);

    const env = new Map(node?.env.map((e) => [e.name, e]));
    for (const name of ["BOTHY_DATABASE_URL", "BOTHY_NODE_ID", "BOTHY_NODE_URL"])
      expect(env.has(name), name).toBe(true);
    // Everything it reads from the Secret and the ConfigMap exists there.
    const secret = one<{
      metadata: { name: string };
      data?: Record<string, string>;
      stringData?: Record<string, string>;
    }>(all, "Secret");
    const secretKeys = new Set([...Object.keys(secret.data ?? {}), ...Object.keys(secret.stringData ?? {})]);
    for (const e of node?.env ?? [])
      if (e.valueFrom?.secretKeyRef) {
        expect(e.valueFrom.secretKeyRef.name).toBe(secret.metadata.name);
        expect(secretKeys.has(e.valueFrom.secretKeyRef.key), e.valueFrom.secretKeyRef.key).toBe(true);
      }
    for (const v of pod.volumes.filter((v) => v.secret))
      for (const item of v.secret?.items ?? []) expect(secretKeys.has(item.key), item.key).toBe(true);
    expect(secretKeys).toEqual(new Set(["BOTHY_DATABASE_URL", "vault.key", "cluster.secret"]));
    // The node signs and checks forwarded requests with the Secret's cluster secret.
    const secretFile = node?.env.find((e) => e.name === "BOTHY_CLUSTER_SECRET_FILE")?.value;
    const mount = node?.volumeMounts.find((m) => secretFile?.startsWith(`${m.mountPath}/`));
    const volume = pod.volumes.find((v) => v.name === mount?.name);
    expect(volume?.secret?.items?.map((i) => `${mount?.mountPath}/${i.path}`)).toContain(secretFile);
    const config = one<{ metadata: { name: string }; data: Record<string, string> }>(all, "ConfigMap");
    expect(node?.envFrom.map((e) => e.configMapRef.name)).toEqual([config.metadata.name]);
    // The database URL is never in the ConfigMap.
    expect(Object.keys(config.data).filter((k) => /DATABASE|PASSWORD|KEY/.test(k))).toEqual([]);

    // The Service and the PodDisruptionBudget select the DaemonSet's pods.
    const labels = ds.spec.template.metadata.labels;
    expect(labels).toMatchObject(ds.spec.selector.matchLabels);
    const service = one<{ spec: { selector: Record<string, string> } }>(all, "Service");
    expect(labels).toMatchObject(service.spec.selector);
    const pdb = one<{ spec: { selector: { matchLabels: Record<string, string> }; maxUnavailable: number } }>(
      all,
      "PodDisruptionBudget",
    );
    expect(labels).toMatchObject(pdb.spec.selector.matchLabels);
    expect(pdb.spec.maxUnavailable).toBe(1);
  });
});

describe("deploy/systemd", () => {
  it("bothy.service passes systemd-analyze verify", async () => {
    const { stderr } = await promisify(execFile)("systemd-analyze", [
      "verify",
      join(DEPLOY, "systemd", "bothy.service"),
    ]);
    expect(stderr).toBe("");
  });
});
