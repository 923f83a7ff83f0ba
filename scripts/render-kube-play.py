#!/usr/bin/env python3
"""Renders deploy/kubernetes into pods that `podman kube play` runs on one machine, as the
kubelet of one node would run them: the DaemonSet's pod template as the node's kvtierd pod,
vllm-example.yaml's pod template as an engine pod (its container running the project's
image's kvtier-load instead of vLLM), and the ConfigMap.

What a kubelet would resolve, this does: hostPath directories live under --node-root (a
fresh directory standing for the node's /), the downward API's spec.nodeName is
--node-name. Sizes shrink to fit a test machine (--host-capacity, --nvme-capacity; the
pod's memory limit keeps the manifest's rule: pool + 2 GiB). Fields podman does not apply
(scheduling, service accounts, priority) are dropped and named on stderr; everything else
is passed as the manifests say it: security contexts, init containers, probes, resources.

  render-kube-play.py --node-root DIR --node-name NAME --out DIR
      writes DIR/configmap.yaml, DIR/kvtierd.yaml, DIR/engine.yaml
"""

import argparse
import copy
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
# Pod fields a single podman host has no use for (no scheduler, API server or tokens).
NOT_APPLIED = ("serviceAccountName", "automountServiceAccountToken", "nodeSelector", "priorityClassName")
# The downward API's fields, as this one node resolves them (spec.nodeName: --node-name).
FIELD_REFS = {"spec.nodeName": None, "status.podIP": "127.0.0.1"}


def load(name):
    with open(os.path.join(DEPLOY, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(name, kind):
    (doc,) = [d for d in load(name) if d["kind"] == kind]
    return doc


def gib(text):
    m = re.fullmatch(r"(\d+)(KiB|MiB|GiB|TiB)", text)
    if not m:
        sys.exit(f"render-kube-play: cannot read the size {text!r}")
    return int(m.group(1)) << {"KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m.group(2)]


def as_pod(template, name, args, dropped):
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": dict(template["metadata"].get("labels", {}))},
           "spec": copy.deepcopy(template["spec"])}
    for field in NOT_APPLIED:
        if field in pod["spec"]:
            dropped.append(f"{name}: spec.{field}")
            del pod["spec"][field]
    for v in pod["spec"].get("volumes", []):
        if "hostPath" in v:
            v["hostPath"]["path"] = os.path.join(args.node_root, v["hostPath"]["path"].lstrip("/"))
    for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        values = {}
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if ref in FIELD_REFS:
                del e["valueFrom"]
                e["value"] = args.node_name if ref == "spec.nodeName" else FIELD_REFS[ref]
            # $(VAR) of an earlier variable, in values, command and args: the kubelet's
            # expansion, which podman 4.3 does not do.
            if "value" in e:
                e["value"] = expand(e["value"], values)
                values[e["name"]] = e["value"]
        for key in ("command", "args"):
            if key in c:
                c[key] = [expand(a, values) for a in c[key]]
    return pod


def expand(text, values):
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m.group(1), m.group(0)), text)


def render(args):
    dropped = []
    # The config: smaller tiers, the same keys.
    cm = one("configmap.yaml", "ConfigMap")
    del cm["metadata"]["namespace"]
    config = yaml.safe_load(cm["data"]["kvtierd.yaml"])
    config["tiers"]["host"]["capacity"] = args.host_capacity
    for f in config["tiers"]["nvme"]["files"]:
        f["capacity"] = args.nvme_capacity
    cm["data"]["kvtierd.yaml"] = yaml.safe_dump(config, sort_keys=False)

    ds = one("daemonset.yaml", "DaemonSet")
    kvtierd = as_pod(ds["spec"]["template"], f"kvtierd-{args.node_name}", args, dropped)
    limit = f"{(gib(args.host_capacity) >> 20) + 2048}Mi"  # the manifest's rule: pool + 2 GiB
    for c in kvtierd["spec"]["containers"]:
        # Pods run without a network here (podman kube play --network none: no bridge
        # addresses); the probes are made in the pod's own network namespace, from the node,
        # at the port the manifest names. Published ports need a network.
        if c.pop("ports", None):
            dropped.append(f"{kvtierd['metadata']['name']}: ports (probes reach the pod's network namespace)")
        c["resources"]["requests"]["memory"] = c["resources"]["limits"]["memory"] = limit
        c["resources"]["requests"]["cpu"] = "100m"  # a 2-core test machine
        c["image"] = args.image
    for c in kvtierd["spec"].get("initContainers", []):
        c["image"] = args.image
    if args.without_init:
        kvtierd["spec"].pop("initContainers", None)
    # A DaemonSet's pods restart Always; podman 4.3 then restarts the init container too,
    # for ever. OnFailure restarts kvtierd on every exit but a clean one.
    kvtierd["spec"]["restartPolicy"] = "OnFailure"
    dropped.append(f"{kvtierd['metadata']['name']}: restartPolicy Always (OnFailure: podman 4.3 reruns init containers)")

    dep = one("vllm-example.yaml", "Deployment")
    engine = as_pod(dep["spec"]["template"], f"engine-{args.node_name}", args, dropped)
    (c,) = engine["spec"]["containers"]
    # The project's image in vLLM's place: kvtier-load is the engine, every byte it reads
    # verified; vLLM's probes, GPU and model volume go with vLLM.
    c["image"] = args.image
    c["command"] = ["/usr/libexec/kvtier/kvtier-load"]
    c["args"] = args.engine_args.split()
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if c.pop(probe, None) is not None:
            dropped.append(f"{engine['metadata']['name']}: {probe} (vLLM's /health)")
    c.pop("ports", None)
    c["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    keep = {"kvtier-socket", "tmp"}
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] in keep]
    engine["spec"]["volumes"] = [v for v in engine["spec"]["volumes"] if v["name"] in keep]
    engine["spec"]["restartPolicy"] = "Never"  # the test restarts it, as a Deployment would
    os.makedirs(args.out, exist_ok=True)
    for name, doc in (("configmap.yaml", cm), ("kvtierd.yaml", kvtierd), ("engine.yaml", engine)):
        with open(os.path.join(args.out, name), "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
    for d in dropped:
        print(f"render-kube-play: not applied by podman: {d}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--node-root", required=True, help="the node's / for hostPath directories")
    p.add_argument("--node-name", default="node-1", help="the node's name (spec.nodeName)")
    p.add_argument("--image", default="localhost/kvtier/kvtierd:0.1.0")
    p.add_argument("--host-capacity", default="512MiB")
    p.add_argument("--nvme-capacity", default="1GiB")
    p.add_argument("--engine-args", default="--seconds 5 --sessions 2 --json",
                   help="kvtier-load's arguments in the engine pod")
    p.add_argument("--without-init", action="store_true",
                   help="leave the init containers out (to show what they are for)")
    p.add_argument("--out", required=True)
    render(p.parse_args())


if __name__ == "__main__":
    main()
