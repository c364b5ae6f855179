// Validates Kubernetes manifests offline, strictly, against the API schemas:
//
//   cd deploy/kubernetes/validate && npm ci && node validate.mjs ../*.yaml
//
// Each document is checked twice:
//  1. against the JSON schema of its kind (kubernetes-models, generated from
//     the Kubernetes OpenAPI spec; @kubernetes-models/prometheus-operator,
//     generated from the operator's CRDs): types, required fields, formats,
//     enums;
//  2. against the same models' TypeScript types, by the TypeScript compiler,
//     so that a key the schema does not define is an error (a misspelt
//     `replicaz:` is otherwise silently dropped by the API server) — what
//     kubeconform's -strict does.
// Kinds this script has no schema for are errors, not skipped, except the
// kustomization file. Exit status 1 on any error.

import { readFileSync, writeFileSync, rmSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";
import ts from "typescript";

const here = dirname(fileURLToPath(import.meta.url));

/** apiVersion → the module holding its kinds. */
const MODULES = {
  v1: "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};
const NOT_RESOURCES = new Set(["kustomize.config.k8s.io/v1beta1/Kustomization"]);

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node validate.mjs MANIFEST.yaml…");
  process.exit(2);
}

const errors = [];
const docs = []; // { where, module, kind, obj }

for (const file of files) {
  const text = readFileSync(file, "utf8");
  const parsed = parseAllDocuments(text, { uniqueKeys: true });
  parsed.forEach((doc, i) => {
    const where = `${relative(process.cwd(), file)}: document ${i + 1}`;
    for (const e of doc.errors) errors.push(`${where}: YAML: ${e.message}`);
    if (doc.errors.length) return;
    const obj = doc.toJS();
    if (obj === null || obj === undefined) return;
    const id = `${obj.apiVersion}/${obj.kind}`;
    if (NOT_RESOURCES.has(id)) return;
    const mod = MODULES[obj.apiVersion];
    if (!mod) {
      errors.push(`${where}: no schema for apiVersion ${obj.apiVersion} (kind ${obj.kind})`);
      return;
    }
    const name = obj.metadata?.name ?? "?";
    docs.push({ where: `${where} (${obj.kind} ${name})`, mod, kind: obj.kind, obj });
  });
}

// 1. JSON schema.
for (const d of docs) {
  const m = await import(d.mod);
  const Model = m[d.kind];
  if (typeof Model !== "function") {
    errors.push(`${d.where}: ${d.mod} has no kind ${d.kind}`);
    d.skip = true;
    continue;
  }
  try {
    new Model(d.obj).validate();
  } catch (e) {
    errors.push(`${d.where}: ${e.message}`);
  }
}

// 2. Unknown keys, through the TypeScript types (one line per document).
const checked = docs.filter((d) => !d.skip);
const src = join(here, ".manifests-check.ts");
const lines = checked.map(
  (d, i) => `import type { I${d.kind} as T${i} } from "${d.mod}"; export const d${i}: T${i} = ${JSON.stringify(d.obj)};`,
);
writeFileSync(src, lines.join("\n") + "\n");
try {
  const program = ts.createProgram([src], {
    noEmit: true,
    strict: true,
    skipLibCheck: true,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    types: [],
  });
  for (const diag of ts.getPreEmitDiagnostics(program)) {
    const msg = ts.flattenDiagnosticMessageText(diag.messageText, "\n");
    if (diag.file && diag.start !== undefined) {
      const { line } = diag.file.getLineAndCharacterOfPosition(diag.start);
      const d = checked[line];
      errors.push(`${d ? d.where : `line ${line + 1}`}: ${msg}`);
    } else {
      errors.push(`typescript: ${msg}`);
    }
  }
} finally {
  rmSync(src, { force: true });
}

for (const e of errors) console.error(`error: ${e}`);
console.log(`${docs.length} documents in ${files.length} files: ${errors.length} error${errors.length === 1 ? "" : "s"}`);
process.exit(errors.length ? 1 : 0);
