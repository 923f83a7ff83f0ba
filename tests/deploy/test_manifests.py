"""deploy/kubernetes and the Containerfile, checked by the tools their users run:
Kubernetes' own schemas (kubernetes-validate --strict), checkov's security policies,
yamllint, promtool for the PrometheusRule, and kvtierd itself for the ConfigMap's config.
The tools come from build-tools/venv (make tools-env); a missing one fails the test."""

import json
import os
import re
import shutil
import subprocess
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
TOOLS = os.environ.get("KVTIER_TOOLS_DIR", os.path.join(ROOT, "build-tools", "venv", "bin"))
BIN = os.environ.get("KVTIER_BIN_DIR", os.path.join(ROOT, "build", "bin"))
MANIFESTS = sorted(os.path.join(DEPLOY, f) for f in os.listdir(DEPLOY) if f.endswith(".yaml"))
# checkov findings accepted, each with its reason in the manifest's annotations and in
# docs/operations.md (Kubernetes).
ACCEPTED = {"CKV_K8S_43", "CKV_K8S_15", "CKV_K8S_23", "CKV_K8S_40", "CKV_K8S_25"}
# Kinds kubernetes-validate has no schema for: checked here instead.
CUSTOM = {"Kustomization", "ServiceMonitor", "PrometheusRule"}


def tool(name):
    path = os.path.join(TOOLS, name)
    assert os.access(path, os.X_OK), f"{path} is missing: run make tools-env"
    return path


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)


def documents():
    for path in MANIFESTS:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    yield os.path.basename(path), doc


def one(kind, name=None):
    found = [d for _, d in documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def test_yamllint_is_clean():
    r = run([tool("yamllint"), "--strict", "-c", os.path.join(DEPLOY, ".yamllint"), DEPLOY])
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_manifest_passes_kubernetes_own_schemas_strictly():
    r = run([tool("kubernetes-validate"), "--strict", *MANIFESTS])
    assert r.returncode == 0, r.stdout + r.stderr
    passed = re.findall(r"passed for resource (\S+)", r.stdout + r.stderr)
    core = [(f, d) for f, d in documents() if d["kind"] not in CUSTOM]
    assert len(passed) == len(core), r.stdout + r.stderr


def test_checkov_finds_nothing_but_the_accepted_findings():
    r = run([tool("checkov"), "-d", DEPLOY, "--framework", "kubernetes", "-o", "json"])
    report = json.loads(r.stdout)
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert failed == [], failed
    skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
    assert skipped <= ACCEPTED, skipped - ACCEPTED
    assert report["summary"]["passed"] > 100
    for fname, d in documents():
        for key, why in d.get("metadata", {}).get("annotations", {}).items():
            if key.startswith("checkov.io/skip"):
                check, _, reason = why.partition("=")
                assert check in ACCEPTED and len(reason) > 20, f"{fname}: {key}: {why}"


def test_the_prometheus_rule_is_the_alert_rules_and_promtool_accepts_it():
    r = run(["python3", os.path.join(ROOT, "scripts", "gen-prometheusrule.py"), "--check"])
    assert r.returncode == 0, r.stdout + r.stderr
    rule = one("PrometheusRule")
    with open(os.path.join(ROOT, "docs", "monitoring", "alerts.yml")) as f:
        assert rule["spec"]["groups"] == yaml.safe_load(f)["groups"]
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus) is missing: scripts/deps.sh"
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump({"groups": rule["spec"]["groups"]}, f)
        f.flush()
        r = run([promtool, "check", "rules", f.name])
    assert r.returncode == 0, r.stdout + r.stderr
    # The ServiceMonitor scrapes the metrics Service as job "kvtier", the job the rules name.
    monitor, service = one("ServiceMonitor"), one("Service", "kvtierd-metrics")
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "kvtier"
    assert 'job="kvtier"' in yaml.safe_dump(rule["spec"])
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


def kvtierd_config():
    return yaml.safe_load(one("ConfigMap", "kvtierd-config")["data"]["kvtierd.yaml"])


def bytes_of(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "Ki": 1 << 10, "Mi": 1 << 20,
             "Gi": 1 << 30, "Ti": 1 << 40}
    m = re.fullmatch(r"(\d+)([KMGT]i(?:B)?)?", str(text))
    assert m, text
    return int(m.group(1)) * units.get(m.group(2) or "", 1)


def test_the_configmaps_config_is_one_kvtierd_accepts():
    text = one("ConfigMap", "kvtierd-config")["data"]["kvtierd.yaml"]
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(f"{d}/lib")
        os.makedirs(f"{d}/run")
        path = f"{d}/kvtierd.yaml"
        with open(path, "w") as f:
            f.write(text.replace("/var/lib/kvtier", f"{d}/lib").replace("/run/kvtier", f"{d}/run"))
        r = run([os.path.join(BIN, "kvtierd"), "--config", path, "--check-config"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_daemonset_fits_its_config_and_probes_it():
    config, ds = kvtierd_config(), one("DaemonSet", "kvtierd")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # Memory: requests = limits (Guaranteed), at least the host pool plus 2 GiB.
    res = c["resources"]
    assert res["requests"]["memory"] == res["limits"]["memory"]
    assert bytes_of(res["limits"]["memory"]) >= bytes_of(config["tiers"]["host"]["capacity"]) + (2 << 30)
    # The socket directory, the data directory and the config are where the config says.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["socket-dir"] == os.path.dirname(config["socket"]["path"])
    assert volumes["socket-dir"]["hostPath"]["path"] == os.path.dirname(config["socket"]["path"])
    assert mounts["data"] == config["data_dir"] == volumes["data"]["hostPath"]["path"]
    for f in config["tiers"]["nvme"]["files"]:
        assert f["path"].startswith(config["data_dir"] + "/"), f
    assert c["args"] == ["--config", os.path.join(mounts["config"], "kvtierd.yaml"), "--node-name", "$(NODE_NAME)"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # Probes on the metrics port kvtierd listens on, beyond the loopback.
    port = next(p for p in c["ports"] if p["name"] == "metrics")
    assert port["containerPort"] == config["metrics"]["port"] and config["metrics"]["listen"] == "0.0.0.0"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # A drain (preStop) finishes within the grace period; one node at a time, old pod first.
    drain = c["lifecycle"]["preStop"]["exec"]["command"]
    assert drain[:2] == ["/usr/bin/kvctl", "drain"]
    assert pod["terminationGracePeriodSeconds"] > int(drain[drain.index("--timeout") + 1])
    update = ds["spec"]["updateStrategy"]
    assert update["type"] == "RollingUpdate" and update["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    # Non-root, the socket group the example engine joins.
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert str(pod["securityContext"]["runAsGroup"]) == str(config["socket"]["group"])
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The host directories, made root-owned 0755 by the kubelet, are handed to kvtierd's
    # uid by an init container that keeps only CHOWN and FOWNER.
    (init,) = pod["initContainers"]
    sc = init["securityContext"]
    assert sc["runAsUser"] == 0 and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    script = " ".join(init["args"])
    uid, gid = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    for name in ("socket-dir", "data"):
        path = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == name)
        assert path == mounts[name] and path in script.split("chown")[1], (name, script)
    assert f"chown {uid}:{gid} " in script
    engine = one("Deployment", "vllm-kvtier-example")["spec"]["template"]["spec"]
    assert int(config["socket"]["group"]) in engine["securityContext"]["supplementalGroups"]
    assert any(v.get("hostPath", {}).get("path") == mounts["socket-dir"] for v in engine["volumes"])


def test_the_kustomization_lists_every_kvtierd_manifest():
    with open(os.path.join(DEPLOY, "kustomization.yaml")) as f:
        listed = set(yaml.safe_load(f)["resources"])
    want = {os.path.basename(p) for p in MANIFESTS} - {"kustomization.yaml", "vllm-example.yaml", "tenant-example.yaml"}
    assert listed == want


# ---- admission-policy.yaml, evaluated ------------------------------------------------
# No Kubernetes API server runs on these machines, so the policy's CEL is evaluated by
# cel-python (the CEL reference semantics, not the API server's type-checked
# environment), with the binding's namespace selector and the validations in the API
# server's order, over vllm-example.yaml's pod in tenant-example.yaml's namespace and over
# what a tenant could change in them.


def admission(cases):
    """Per (pod, namespace) of `cases`: None when the binding does not select the namespace,
    else the messages the policy denies the pod with (tests/deploy/cel_admission.py)."""
    policy, binding = one("ValidatingAdmissionPolicy"), one("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy["spec"]["failurePolicy"] == "Fail" and binding["spec"]["validationActions"] == ["Deny"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert any({"pods", "pods/ephemeralcontainers"} <= set(r["resources"]) and "CREATE" in r["operations"]
               for r in rules)
    req = {"policy": policy, "binding": binding, "cases": [{"pod": p, "namespace": n} for p, n in cases]}
    r = run([tool("python"), os.path.join(ROOT, "tests", "deploy", "cel_admission.py")], input=json.dumps(req))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def engine_pod():
    d = one("Deployment", "vllm-kvtier-example")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "engine", "namespace": d["metadata"]["namespace"]},
            "spec": json.loads(json.dumps(d["spec"]["template"]["spec"]))}


def test_the_admission_policy_admits_the_example_engine_in_its_tenant_namespace():
    team = one("Namespace", "team-a")
    assert engine_pod()["metadata"]["namespace"] == "team-a"
    # kvtierd's own namespace is not a tenant's: the policy does not apply there.
    assert admission([(engine_pod(), team), (engine_pod(), one("Namespace", "kvtier"))]) == [[], None]


def test_the_admission_policy_refuses_every_other_identity_and_host_path():
    team = one("Namespace", "team-a")

    def changed(edit):
        pod = engine_pod()
        edit(pod["spec"])
        return pod, team

    def sc(spec):
        return spec["securityContext"]

    def c0(spec):
        return spec["containers"][0].setdefault("securityContext", {})

    refused = {
        "kvtierd's uid (an admin)": lambda s: sc(s).update(runAsUser=10001),
        "another team's uid": lambda s: sc(s).update(runAsUser=10003),
        "no uid at all (the image's)": lambda s: sc(s).pop("runAsUser"),
        "root in one container": lambda s: c0(s).update(runAsUser=0),
        "an init container as root": lambda s: s.setdefault("initContainers", []).append(
            {"name": "i", "image": "x", "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False}}),
        "an ephemeral container as kvtierd": lambda s: s.setdefault("ephemeralContainers", []).append(
            {"name": "e", "image": "x", "securityContext": {"runAsUser": 10001, "allowPrivilegeEscalation": False}}),
        "the root group": lambda s: sc(s).update(runAsGroup=0),
        "no group (the image's)": lambda s: sc(s).pop("runAsGroup"),
        "a supplementary group not the team's": lambda s: sc(s).update(supplementalGroups=[10001, 0]),
        "privilege escalation allowed": lambda s: c0(s).update(allowPrivilegeEscalation=True),
        "privilege escalation not said": lambda s: c0(s).pop("allowPrivilegeEscalation"),
        "CAP_SETUID": lambda s: c0(s).update(capabilities={"add": ["SETUID"]}),
        "privileged": lambda s: c0(s).update(privileged=True),
        "the NVMe slot files": lambda s: s["volumes"].append(
            {"name": "d", "hostPath": {"path": "/var/lib/kvtier"}}),
        "the host's root": lambda s: s["volumes"].append({"name": "r", "hostPath": {"path": "/"}}),
        "a parent of the socket directory": lambda s: s["volumes"][0]["hostPath"].update(path="/run"),
        "hostPID": lambda s: s.update(hostPID=True),
        "a user namespace": lambda s: s.update(hostUsers=False),
    }
    # What stays allowed: NET_BIND_SERVICE, the uid set per container, a trailing slash.
    allowed = [
        lambda s: c0(s).update(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
        lambda s: (sc(s).pop("runAsUser"), c0(s).update(runAsUser=10002)),
        lambda s: s["volumes"][0]["hostPath"].update(path="/run/kvtier/"),
    ]
    results = admission([changed(e) for e in list(refused.values()) + allowed])
    for what, errors in zip(refused, results):
        assert errors, f"{what}: admitted"
        assert not any(e.startswith("error:") for e in errors), (what, errors)
    assert results[len(refused):] == [[]] * len(allowed)


def test_the_admission_policy_refuses_a_namespace_labelled_with_root_or_kvtierds_uid():
    labels = (("0", "10001"), ("10001", "10001"), ("10002", "0.10001"), ("abc", "10001"))
    cases = []
    for uid, groups in labels:
        ns = json.loads(json.dumps(one("Namespace", "team-a")))
        ns["metadata"]["labels"].update({"kvtier.io/uid": uid, "kvtier.io/groups": groups})
        cases.append((engine_pod(), ns))
    for (uid, groups), errors in zip(labels, admission(cases)):
        assert any("labels must name" in e for e in errors), (uid, groups, errors)


def containerfile_stages():
    stages, current = [], None
    with open(os.path.join(ROOT, "Containerfile")) as f:
        text = re.sub(r"\\\n", " ", f.read())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            current = {"from": rest, "lines": []}
            stages.append(current)
        elif current is not None:
            current["lines"].append((word.upper(), rest.strip()))
    return stages


def test_the_containerfile_builds_with_deps_sh_and_runs_slim_as_non_root():
    build, run_stage = containerfile_stages()
    assert build["from"].endswith("AS build")
    assert any(w == "RUN" and "scripts/deps.sh" in r and "cpack -G DEB" in r for w, r in build["lines"])
    assert "${RUNTIME_BASE}" in run_stage["from"]
    with open(os.path.join(ROOT, "Containerfile")) as f:
        assert re.search(r"ARG RUNTIME_BASE=\S+:bookworm-slim", f.read())
    lines = dict(run_stage["lines"])  # the last of each instruction
    assert any(w == "COPY" and r.startswith("--from=build") for w, r in run_stage["lines"])
    user = lines["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0
    assert '"/usr/bin/kvctl", "health", "--live"' in lines["HEALTHCHECK"]
    assert lines["ENTRYPOINT"] == '["/usr/bin/kvtierd"]'
    assert "/run/kvtier" in lines["VOLUME"] and "/var/lib/kvtier" in lines["VOLUME"]
    assert lines["EXPOSE"] == "9490"
    # The carried config is the package's: metrics on loopback unless a mounted one says
    # otherwise (nothing rewrites metrics.listen into the image).
    with open(os.path.join(ROOT, "Containerfile")) as f:
        assert "listen:" not in f.read()
