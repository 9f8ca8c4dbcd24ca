// Validates deploy/k8s/ offline: every YAML document there must parse, and each object must pass
// its Kubernetes API schema (kubernetes-models: the OpenAPI schemas of the Kubernetes release it
// was generated from, compiled to validators; no cluster and no network needed). The schemas do
// not refuse unknown fields, so the fields the design rests on are checked by name below, with
// the references between the objects (Service selectors, port names, volumes, the seed's SRV name).
//
//   node --test validate.test.mjs [DIR]       (tests/k8s/run.sh; DIR defaults to deploy/k8s)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';

const here = path.dirname(fileURLToPath(import.meta.url));
const dir = process.env.SLUICE_K8S_DIR || path.join(here, '..', '..', 'deploy', 'k8s');

// apiVersion -> the kubernetes-models module of that group and version.
function modulePath(apiVersion) {
  return apiVersion.includes('/') ? `kubernetes-models/${apiVersion}` : `kubernetes-models/v1`;
}

function loadObjects() {
  const files = fs.readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).sort();
  assert.ok(files.length > 0, `no YAML files in ${dir}`);
  const objects = [];
  for (const f of files) {
    const text = fs.readFileSync(path.join(dir, f), 'utf8');
    for (const [i, doc] of parseAllDocuments(text, { uniqueKeys: true }).entries()) {
      assert.deepEqual(doc.errors.map((e) => e.message), [], `${f} document ${i + 1}: YAML errors`);
      const obj = doc.toJS();
      if (obj === null) continue;  // an empty document
      objects.push({ where: `${f} document ${i + 1} (${obj.kind} ${obj.metadata?.name})`, obj });
    }
  }
  return objects;
}

const objects = loadObjects();
const find = (kind, name) => objects.map((o) => o.obj).find((o) => o.kind === kind && o.metadata.name === name);

test('every object passes its Kubernetes schema', async () => {
  for (const { where, obj } of objects) {
    assert.ok(typeof obj.apiVersion === 'string' && typeof obj.kind === 'string', `${where}: apiVersion and kind`);
    assert.ok(obj.metadata?.name, `${where}: metadata.name`);
    let mod;
    try {
      mod = await import(modulePath(obj.apiVersion));
    } catch (e) {
      assert.fail(`${where}: no schemas for apiVersion ${obj.apiVersion} (${e.message})`);
    }
    const Model = mod[obj.kind];
    assert.ok(Model, `${where}: kind ${obj.kind} does not exist in ${obj.apiVersion}`);
    assert.doesNotThrow(() => new Model(obj).validate(), (e) => { throw new Error(`${where}: ${e.message}`); });
  }
  // A schema error is caught: the validator is not a no-op.
  const { Service } = await import('kubernetes-models/v1');
  assert.throws(() => new Service({ metadata: { name: 'x' }, spec: { ports: [{ port: 'peer' }] } }).validate());
});

test('the StatefulSet finds its peers through a headless Service that lists unready pods', () => {
  const sts = find('StatefulSet', 'sluice');
  assert.ok(sts, 'StatefulSet sluice');
  const peers = find('Service', sts.spec.serviceName);
  assert.ok(peers, `the StatefulSet's serviceName ${sts.spec.serviceName} is a Service here`);
  assert.equal(peers.spec.clusterIP, 'None', 'headless');
  assert.equal(peers.spec.publishNotReadyAddresses, true);
  const labels = sts.spec.template.metadata.labels;
  assert.deepEqual(sts.spec.selector.matchLabels, labels, 'the selector matches the pod labels');
  for (const svc of objects.map((o) => o.obj).filter((o) => o.kind === 'Service')) {
    for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(labels[k], v, `Service ${svc.metadata.name} selects the pods`);
  }
  const pdb = find('PodDisruptionBudget', 'sluice');
  assert.equal(pdb.spec.maxUnavailable, 1);
  assert.deepEqual(pdb.spec.selector.matchLabels, labels);

  // The seed in the config template is the SRV record of the headless Service's peer port.
  const peerPort = peers.spec.ports.find((p) => p.name === 'peer');
  assert.ok(peerPort && peerPort.protocol === 'UDP', 'the headless Service has a UDP port named peer');
  const template = find('ConfigMap', 'sluice-config').data['sluiced.yaml.in'];
  assert.match(template, new RegExp(`dns\\+srv:_peer\\._udp\\.${peers.metadata.name}\\.@POD_NAMESPACE@\\.svc\\.cluster\\.local`));
});

test('the pod: ports, probes, drain, config, secret, rules and data are wired up', () => {
  const sts = find('StatefulSet', 'sluice');
  const pod = sts.spec.template.spec;
  const [c] = pod.containers;
  const ports = new Map(c.ports.map((p) => [p.name, p]));
  for (const svc of objects.map((o) => o.obj).filter((o) => o.kind === 'Service')) {
    for (const p of svc.spec.ports) {
      const target = ports.get(p.targetPort);
      assert.ok(target, `Service ${svc.metadata.name} port ${p.name}: targetPort ${p.targetPort} is a container port`);
      assert.equal(target.protocol, p.protocol, `Service ${svc.metadata.name} port ${p.name}: protocol`);
    }
  }
  // Liveness and startup: the admin port answers (restored); readiness: joined as well.
  for (const [probe, path] of [['startupProbe', '/healthz'], ['readinessProbe', '/readyz'],
                               ['livenessProbe', '/healthz']]) {
    assert.equal(c[probe]?.httpGet?.path, path, probe);
    assert.ok(ports.has(c[probe].httpGet.port), `${probe} port`);
  }
  const preStop = c.lifecycle.preStop.exec.command;
  assert.deepEqual(preStop.slice(0, 2), ['/usr/local/bin/sluicectl', 'drain']);

  // The config template: the command fills in every placeholder it holds.
  const template = find('ConfigMap', 'sluice-config').data['sluiced.yaml.in'];
  const script = c.command.join(' ');
  for (const placeholder of new Set(template.match(/@[A-Z_]+@/g))) {
    assert.ok(script.includes(`s/${placeholder}/`), `the command replaces ${placeholder}`);
  }
  assert.match(template, /node_id: @NODE_ID@/);
  assert.match(script, /\$\(\(ordinal \+ 1\)\)/, 'node_id is the ordinal + 1');

  // Volumes: each mount has a volume, each ConfigMap and Secret volume is a directory (no
  // subPath: updates swap the ..data symlink), and the config's paths point into them.
  const volumes = new Map(pod.volumes.map((v) => [v.name, v]));
  const claims = new Set(sts.spec.volumeClaimTemplates.map((t) => t.metadata.name));
  const mounts = new Map();
  for (const m of c.volumeMounts) {
    assert.ok(volumes.has(m.name) || claims.has(m.name), `mount ${m.name} has a volume`);
    assert.equal(m.subPath, undefined, `mount ${m.name} is a directory`);
    mounts.set(m.name, m.mountPath);
  }
  assert.ok(template.includes(`rules: ${mounts.get('rules')}/rules.yaml`), 'rules file in the rules mount');
  assert.ok(find('ConfigMap', volumes.get('rules').configMap.name).data['rules.yaml'], 'the rules ConfigMap has rules.yaml');
  assert.ok(template.includes(`secret_file: ${mounts.get('secret')}/secret`), 'secret_file in the secret mount');
  assert.ok(volumes.get('secret').secret.secretName, 'the cluster secret comes from a Secret');
  // The admin token: from the same Secret, in the config and in the drain (a write).
  const token = `${mounts.get('secret')}/admin-token`;
  assert.ok(template.includes(`admin_token_file: ${token}`), 'admin_token_file in the secret mount');
  assert.equal(preStop[preStop.indexOf('--token-file') + 1], token, 'the drain sends the admin token');
  // The Redis door listens off loopback, so it has a password (sluiced refuses it without one),
  // from the same Secret, and its port is the container's "redis" port.
  assert.ok(template.includes(`resp_password_file: ${mounts.get('secret')}/resp-password`),
            'resp_password_file in the secret mount');
  assert.equal(Number(template.match(/^resp: 0\.0\.0\.0:(\d+)/m)?.[1]), ports.get('redis')?.containerPort,
               'the RESP door listens on the container port "redis"');
  assert.ok(template.includes(`data_dir: ${mounts.get('data')}/`), 'data_dir on the volume claim');
  assert.ok(script.includes(mounts.get('run')), 'the generated config goes to the writable run volume');

  // Locked down.
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.equal(c.securityContext.readOnlyRootFilesystem, true);
  assert.deepEqual(c.securityContext.capabilities.drop, ['ALL']);
  assert.equal(c.securityContext.allowPrivilegeEscalation, false);
  assert.ok(c.resources.requests.cpu && c.resources.requests.memory && c.resources.limits.memory, 'resources');
});
