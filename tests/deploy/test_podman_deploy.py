"""deploy/kubernetes run as an operator runs it, on one node: `make test-deploy`.

Kubernetes cannot run here; podman runs pod specs (`podman kube play`). The manifests are
rendered by scripts/render-kube-play.py (the DaemonSet's pod template as this node's
kvtierd pod, vllm-example.yaml's pod template as an engine pod running the image's
kvtier-load, the ConfigMap) and played in order:

1. a fresh node: the hostPath directories made root-owned 0755, as the kubelet makes them;
   without the init container kvtierd cannot start there, with it the pod turns ready;
2. an engine pod in its own PID namespace drives traffic through the socket on the hostPath,
   every byte read verified, some sessions abandoned with pages leased while the process
   lives and writes over them; the memory cgroups show where the pool is charged;
3. the engine container killed (SIGKILL) and its pod started again;
4. the kvtierd pod replaced as the DaemonSet's rolling update does (preStop drain, stop,
   a new pod on the same node): the NVMe cache is warm in the new pod.

What podman 4.3 does not do as the kubelet would, the test does itself or names: probes
(podman turns httpGet into a curl the image lacks, on port 0): the test GETs the manifest's
paths in the pod's network namespace; preStop hooks: the test runs the manifest's command;
restartPolicy Always reruns init containers in podman 4.3: the pod runs OnFailure. Pods run
with no network (no addresses beyond each pod's loopback).

Needs root, podman and the image (scripts/deploy-image.sh, which make test-deploy runs first).
Figures go to stdout (pytest -s) and $KVTIER_DEPLOY_REPORT as JSON.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
IMAGE = os.environ.get("KVTIER_DEPLOY_IMAGE", "localhost/kvtier/kvtierd:0.1.0")
ENV = dict(os.environ, CONTAINERS_CONF=os.path.join(ROOT, "tests", "deploy", "containers.conf"))
NODE = "node-1"
KVTIERD_POD, ENGINE_POD = f"kvtierd-{NODE}", f"engine-{NODE}"
KVTIERD, ENGINE, INIT = f"{KVTIERD_POD}-kvtierd", f"{ENGINE_POD}-vllm", f"{KVTIERD_POD}-prepare-host-dirs"
HOST_CAPACITY = 512 << 20
LOAD = "-s /run/kvtier/kvtierd.sock --sessions 2 --prefixes 16 --depth 8 --json"
REPORT = {}


def podman(*args, check=True, timeout=180):
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: rc {r.returncode}: {r.stderr[-2000:]}")
    return r


def wait_for(what, pred, seconds=30, every=0.25):
    deadline = time.monotonic() + seconds
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(every)


def manifest(name, kind):
    with open(os.path.join(DEPLOY, name)) as f:
        (doc,) = [d for d in yaml.safe_load_all(f) if d and d["kind"] == kind]
    return doc


class Node:
    """One node: its / for hostPath directories, the rendered pods, what runs on it."""

    def __init__(self, base):
        self.root = os.path.join(base, "root")
        self.rendered = os.path.join(base, "rendered")
        os.makedirs(self.root)
        spec = manifest("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        # The kubelet's probes: a GET of each path on the named port, from the node.
        self.probes = {k: (c[k]["httpGet"]["path"], ports[c[k]["httpGet"]["port"]])
                       for k in ("startupProbe", "livenessProbe", "readinessProbe")}
        self.pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        self.grace = spec["terminationGracePeriodSeconds"]

    def render(self, engine_args, without_init=False):
        args = ["python3", os.path.join(ROOT, "scripts", "render-kube-play.py"), "--node-root", self.root,
                "--node-name", NODE, "--image", IMAGE, "--host-capacity", f"{HOST_CAPACITY >> 20}MiB",
                "--nvme-capacity", "1GiB", "--engine-args", engine_args, "--out", self.rendered]
        if without_init:
            args.append("--without-init")
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stderr

    def play_kvtierd(self):
        with open(os.path.join(self.rendered, "play-kvtierd.yaml"), "w") as out:
            for name in ("configmap.yaml", "kvtierd.yaml"):
                with open(os.path.join(self.rendered, name)) as f:
                    out.write(f.read() + "\n---\n")
        podman("kube", "play", "--network", "none", os.path.join(self.rendered, "play-kvtierd.yaml"))

    def play_engine(self):
        podman("kube", "play", "--network", "none", os.path.join(self.rendered, "engine.yaml"))

    def pid(self, container):
        r = podman("inspect", container, "--format", "{{.State.Pid}}", check=False)
        return int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip().isdigit() else 0

    def probe(self, which):
        path, port = self.probes[which]
        pid = self.pid(KVTIERD)
        if pid <= 0:
            return 0
        r = subprocess.run(["nsenter", "-t", str(pid), "-n", "curl", "-s", "-o", "/dev/null", "-m", "5", "-w",
                            "%{http_code}", f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True,
                           timeout=30)
        return int(r.stdout or 0)

    def kvctl(self, *args):
        r = podman("exec", KVTIERD, "kvctl", *args, "--json", timeout=700)
        return json.loads(r.stdout)

    def tier(self, name):
        return next(t for t in self.kvctl("tiers")["tiers"] if t["name"] == name)

    def logs(self, container):
        r = podman("logs", container, check=False)
        return r.stdout + r.stderr

    def engine_result(self):
        wait_for("the engine pod's kvtier-load to finish",
                 lambda: podman("inspect", ENGINE, "--format", "{{.State.Status}}").stdout.strip() == "exited", 120)
        out = podman("logs", ENGINE).stdout
        code = int(podman("inspect", ENGINE, "--format", "{{.State.ExitCode}}").stdout.strip())
        return code, json.loads(out[out.index("{"):out.rindex("}") + 1])

    def engine_pid(self):
        """The engine's pid once it runs; fails with its log if it ends first."""
        def running():
            state = podman("inspect", ENGINE, "--format", "{{.State.Status}}", check=False).stdout.strip()
            if state in ("exited", "stopped"):
                raise AssertionError(f"the engine ended before it was looked at: {self.logs(ENGINE)[-1500:]}")
            return self.pid(ENGINE)
        return wait_for("the engine's process", running, 30)

    def remove(self, pod):
        # `pod rm -f` can fail while a container of the pod is still exiting (the next play
        # of that name then finds it): removed again until it is gone, bounded.
        deadline = time.monotonic() + 60
        while True:
            podman("pod", "rm", "-f", "-t", "0", pod, check=False)
            if podman("pod", "exists", pod, check=False).returncode != 0 or time.monotonic() > deadline:
                return
            time.sleep(0.5)


def cgroup_dir(pid):
    """The container's memory cgroup directory (cgroup v1 memory, or v2)."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "memory":
                return "/sys/fs/cgroup/memory" + path
            if controllers == "":
                v2 = "/sys/fs/cgroup" + path
    return v2


def memory(pid):
    d = cgroup_dir(pid)
    v1 = os.path.exists(os.path.join(d, "memory.usage_in_bytes"))
    with open(os.path.join(d, "memory.usage_in_bytes" if v1 else "memory.current")) as f:
        usage = int(f.read())
    stat = dict(line.split() for line in open(os.path.join(d, "memory.stat")))
    limit_file = os.path.join(d, "memory.limit_in_bytes" if v1 else "memory.max")
    with open(limit_file) as f:
        limit = f.read().strip()
    return {"cgroup": d, "usage": usage, "shmem": int(stat["total_shmem" if v1 else "shmem"]), "limit": limit}


@pytest.fixture(scope="module")
def node():
    if os.geteuid() != 0:
        pytest.fail("make test-deploy needs root (podman, hostPath directories owned by root)")
    assert shutil.which("podman"), "podman is missing: scripts/deps.sh"
    assert podman("image", "exists", IMAGE, check=False).returncode == 0, f"{IMAGE} is missing: scripts/deploy-image.sh"
    for pod in (KVTIERD_POD, ENGINE_POD):
        podman("pod", "rm", "-f", "-t", "0", pod, check=False)
    base = tempfile.mkdtemp(prefix="kvtier-node-", dir="/var/tmp")
    n = Node(base)
    yield n
    for pod in (ENGINE_POD, KVTIERD_POD):
        n.remove(pod)
    shutil.rmtree(base, ignore_errors=True)
    path = os.environ.get("KVTIER_DEPLOY_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(REPORT, f, indent=2)
    print("\nmake test-deploy figures:\n" + json.dumps(REPORT, indent=2))


def test_1_a_fresh_node_with_root_owned_host_directories(node):
    # The kubelet makes missing hostPath directories (DirectoryOrCreate) root-owned 0755.
    dirs = [os.path.join(node.root, "run", "kvtier"), os.path.join(node.root, "var", "lib", "kvtier")]
    for d in dirs:
        os.makedirs(d, mode=0o755)
        os.chmod(d, 0o755)
    # Without the init container kvtierd (uid 10001) cannot take its lock there.
    node.render(LOAD + " --seconds 6", without_init=True)
    node.play_kvtierd()
    log = wait_for("kvtierd refused its data directory", lambda: (lambda s: s if "kvtierd.lock" in s else "")(
        node.logs(KVTIERD)), 30)
    assert "ermission denied" in log or "PERMISSION_DENIED" in log, log[-1500:]
    node.remove(KVTIERD_POD)
    REPORT["without_init_container"] = [l for l in log.splitlines() if "kvtierd.lock" in l][-1][-200:]
    # The manifests as shipped: the init container hands the directories to kvtierd.
    notes = node.render(LOAD + " --seconds 6")
    node.play_kvtierd()
    wait_for("startup probe", lambda: node.probe("startupProbe") == 200, 60)
    wait_for("readiness probe", lambda: node.probe("readinessProbe") == 200, 60)
    assert node.probe("livenessProbe") == 200
    for d in dirs:
        st = os.stat(d)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (10001, 10001, 0o750), (d, st)
    status = podman("inspect", INIT, "--format", "{{.State.ExitCode}}", check=False)
    REPORT["fresh_node"] = {"probes": {k: 200 for k in node.probes}, "host_dirs": "10001:10001 0750",
                            "init_container": "exited 0" if status.returncode != 0 or status.stdout.strip() == "0"
                            else status.stdout.strip(),
                            "not_applied_by_podman": [l.split(": ", 1)[1] for l in notes.splitlines() if ": " in l]}


def test_2_an_engine_pod_in_its_own_pid_namespace_with_every_byte_verified(node):
    node.render(LOAD + " --seconds 8 --abandon-every 40")
    node.play_engine()
    engine_pid = node.engine_pid()
    daemon_pid = node.pid(KVTIERD)
    assert os.readlink(f"/proc/{engine_pid}/ns/pid") != os.readlink(f"/proc/{daemon_pid}/ns/pid")
    sessions = wait_for("the engine's sessions", lambda: [s for s in node.kvctl("sessions")["sessions"]
                                                          if s["role"] == "engine"], 30)
    # kvtierd cannot see the engine's pid (another PID namespace), yet watches its process.
    assert all(s["pid"] == 0 and s["engine_pid"] > 0 and s["watched"] for s in sessions), sessions
    time.sleep(2)  # let it write; the cgroups are read while the engine lives
    eng, dmn = memory(engine_pid), memory(daemon_pid)
    code, r = node.engine_result()
    assert code == 0 and r["corrupt"] == 0 and r["errors"] == 0, r
    assert r["stored"] > 0 and r["hit_blocks"] > 0 and r["abandoned_sessions"] > 0, r
    # Abandoned pages wait for the process; it has exited: nothing stays leased or quarantined.
    host = wait_for("pages back after the engine exited",
                    lambda: (lambda t: t if t["leased_pages"] == 0 and t["quarantined_pages"] == 0 else None)(
                        node.tier("host")), 30)
    # The pool is charged to kvtierd's pod, not to the engine's, which writes into it.
    assert dmn["shmem"] >= HOST_CAPACITY, dmn
    assert eng["usage"] < 64 << 20, eng
    REPORT["engine_pod"] = {
        "pid_namespaces": "different", "sessions_seen_as": [{k: s[k] for k in ("pid", "engine_pid", "watched")}
                                                           for s in sessions],
        "kvtier_load": {k: r[k] for k in ("requests", "blocks", "hit_blocks", "stored", "corrupt", "errors",
                                          "abandoned_sessions")},
        "host_after": {k: host[k] for k in ("leased_pages", "quarantined_pages", "cached_pages")},
        "memory_cgroups": {"kvtierd": dmn, "engine_while_running": eng}}


def test_3_the_engine_container_killed_and_its_pod_started_again(node):
    node.remove(ENGINE_POD)
    node.render(LOAD + " --seconds 30 --abandon-every 20")
    node.play_engine()
    wait_for("the engine's sessions", lambda: [s for s in node.kvctl("sessions")["sessions"]
                                               if s["role"] == "engine"], 30)
    # Abandoned sessions' pages are held while the engine's process lives.
    held = wait_for("pages quarantined for the live engine", lambda: node.tier("host")["quarantined_pages"], 30)
    podman("kill", "--signal", "KILL", ENGINE)
    host = wait_for("the killed engine's pages back",
                    lambda: (lambda t: t if t["leased_pages"] == 0 and t["quarantined_pages"] == 0 else None)(
                        node.tier("host")), 30)
    assert not [s for s in node.kvctl("sessions")["sessions"] if s["role"] == "engine"]
    node.remove(ENGINE_POD)
    node.render(LOAD + " --seconds 5 --abandon-every 40")
    node.play_engine()
    code, r = node.engine_result()
    assert code == 0 and r["corrupt"] == 0 and r["errors"] == 0 and r["hit_blocks"] > 0, r
    REPORT["engine_killed"] = {"quarantined_pages_while_it_lived": held,
                               "host_after_kill": {k: host[k] for k in ("leased_pages", "quarantined_pages")},
                               "restarted_run": {k: r[k] for k in ("requests", "hit_blocks", "corrupt", "errors")}}


def test_4_a_rolling_update_keeps_the_nvme_cache_warm(node):
    node.remove(ENGINE_POD)
    # What the kubelet does to the old pod: its preStop hook, then SIGTERM within the grace.
    podman("exec", KVTIERD, *node.pre_stop, timeout=700)
    nvme_before = node.tier("nvme")
    assert nvme_before["blocks"] > 0, nvme_before
    podman("pod", "stop", "-t", str(node.grace), KVTIERD_POD, timeout=node.grace + 60)
    assert "inconsistent" not in node.logs(KVTIERD)
    node.remove(KVTIERD_POD)
    # The new pod on the same node.
    node.play_kvtierd()
    wait_for("readiness probe of the new pod", lambda: node.probe("readinessProbe") == 200, 60)
    nvme_after = node.tier("nvme")
    assert nvme_after["blocks"] == nvme_before["blocks"], (nvme_before, nvme_after)
    node.render(LOAD + " --seconds 4")
    node.play_engine()
    code, r = node.engine_result()
    assert code == 0 and r["corrupt"] == 0 and r["errors"] == 0, r
    status = node.kvctl("status")
    # The new pod's first hits came from NVMe: promoted into its (empty) host tier.
    assert r["hit_blocks"] > 0 and status["promotions"] > 0, (r, status)
    REPORT["rolling_update"] = {"nvme_blocks_before": nvme_before["blocks"], "nvme_blocks_after": nvme_after["blocks"],
                                "first_run_after": {k: r[k] for k in ("requests", "hit_blocks", "corrupt")},
                                "new_pod": {k: status[k] for k in ("block_hits", "hit_ratio", "promotions")}}
