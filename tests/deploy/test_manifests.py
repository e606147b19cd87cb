"""The deployment as a whole: k8s/ manifests, the Dockerfile and .dockerignore.

Offline and fast. Every object is checked against the Kubernetes 1.30 schemas (strict: unknown
fields fail), and against the code it deploys: container args and DSFLASH_* settings go through
the real `dsflash` parser, probes must hit the ports and gRPC services the workers serve, HPAs
must scale on metrics the workers export, and the image must install what setup.py builds.
With `kubectl` on PATH the kustomizations are also rendered and checked as applied.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dsflash.cli import _env, build_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
KUBE_VERSION = "1.30.0"
ROLES = ("gateway", "prefill", "decode")
WORKERS = ("prefill", "decode")
GRPC_SERVICES = {"prefill": "dsflash.v1.Prefill", "decode": "dsflash.v1.Decode"}
CHECKPOINT_MOUNT = "/models/DeepSeek-V4.1-Flash"
FAKE_POD_IP = "10.1.2.3"
# Kinds that are not in the Kubernetes schemas (Prometheus Operator CRDs): checked by hand below.
CRD_GROUPS = ("monitoring.coreos.com/",)


# ---------------------------------------------------------------- loading

def load_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomizations() -> dict[Path, dict]:
    return {path: yaml.safe_load(path.read_text()) for path in sorted(K8S.rglob("kustomization.yaml"))}


def resource_files() -> list[Path]:
    """Manifest files: every kustomization's `resources`, plus the *.example.yaml files."""
    files = []
    for path, kust in kustomizations().items():
        for entry in kust.get("resources", []):
            target = (path.parent / entry).resolve()
            if target.is_file():
                files.append(target)
    return sorted(set(files)) + sorted(K8S.rglob("*.example.yaml"))


def base_docs() -> list[dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [doc for entry in kust["resources"] for doc in load_docs(K8S / entry)]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def dsflash_containers(docs: list[dict]):
    """(deployment, pod spec, container) for every container running the dsflash image."""
    for dep in by_kind(docs, "Deployment").values():
        pod = dep["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if image_name(container["image"]) == "dsflash":
                yield dep, pod, container


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


def role_of(container: dict) -> str:
    return container["args"][0]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flag_twins(role: str) -> set[str]:
    return {_env(opt) for action in subcommands()[role]._actions for opt in action.option_strings
            if opt.startswith("--") and opt != "--help"}


def container_env(container: dict, docs: list[dict]) -> dict[str, str]:
    """The environment Kubernetes would give the container; pod IPs and secrets as stand-ins."""
    maps = by_kind(docs, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in maps, f"{container['name']}: envFrom names a missing ConfigMap {name}"
        env.update(maps[name]["data"])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", item
            env[item["name"]] = FAKE_POD_IP
        else:
            assert "secretKeyRef" in item["valueFrom"], item
            env[item["name"]] = "test-api-key"
    return env


def parse_container(container: dict, docs: list[dict], monkeypatch) -> argparse.Namespace:
    """The container's command line as `dsflash` itself parses it, env twins included."""
    env = container_env(container, docs)
    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith("DSFLASH_")]:
            m.delenv(name)
        for name, value in env.items():
            m.setenv(name, value)
        return build_parser().parse_args(container["args"])


def port_named(container: dict, name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert name in ports, f"{container['name']}: no containerPort named {name!r}"
    return ports[name]


QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
SCALE = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value) -> float:
    text = str(value)
    match = QUANTITY.match(text)
    assert match, f"{text!r} is not a Kubernetes quantity (e.g. 192Gi, 500m, 16)"
    suffix = match.group(2) or ""
    return float(text[: len(text) - len(suffix)]) * SCALE[suffix]


# ---------------------------------------------------------------- files and schemas

def test_every_file_is_listed_by_a_kustomization():
    listed = set()
    for path, kust in kustomizations().items():
        for key in ("resources", "components"):
            for entry in kust.get(key, []):
                target = (path.parent / entry).resolve()
                assert target.exists(), f"{path}: {key} entry {entry} does not exist"
                listed.add(target)
        for patch in kust.get("patches", []):
            listed.add((path.parent / patch["path"]).resolve())
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        if path.name.endswith(".example.yaml"):
            # Examples (placeholder secrets, rules to merge) must never be applied by accident.
            assert path.resolve() not in listed, f"{path} is an example and must not be listed"
        else:
            assert path.resolve() in listed, f"{path.relative_to(ROOT)} is not listed by any kustomization.yaml"


@pytest.mark.parametrize("path", resource_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifests_are_valid_kubernetes_1_30(path):
    docs = load_docs(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            assert doc["kind"] == "PodMonitor" and doc["spec"]["podMetricsEndpoints"], doc
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_objects_live_in_the_dsflash_namespace():
    for doc in base_docs():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "dsflash", doc["metadata"]["name"]
    assert yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"] == "dsflash"


def test_resource_quantities_are_well_formed():
    for dep in by_kind(base_docs(), "Deployment").values():
        pod = dep["spec"]["template"]["spec"]
        for container in pod["containers"]:
            res = container.get("resources", {})
            for section in ("requests", "limits"):
                for value in res.get(section, {}).values():
                    quantity(value)
        for volume in pod.get("volumes", []):
            if "emptyDir" in volume and "sizeLimit" in volume["emptyDir"]:
                quantity(volume["emptyDir"]["sizeLimit"])


# ---------------------------------------------------------------- the containers' command lines

def check_command_lines(docs: list[dict], monkeypatch) -> None:
    seen_roles = set()
    for dep, pod, container in dsflash_containers(docs):
        role = role_of(container)
        assert role in ROLES, f"{dep['metadata']['name']}: {role!r} is not a serving subcommand"
        assert dep["metadata"]["labels"]["app.kubernetes.io/component"] == role
        seen_roles.add(role)
        args = parse_container(container, docs, monkeypatch)
        # Service links would add DSFLASH_<SERVICE>_PORT=tcp://... beside the flag twins.
        assert pod.get("enableServiceLinks") is False, dep["metadata"]["name"]
        twins = flag_twins(role)
        for name in container_env(container, docs):
            if name.startswith("DSFLASH_"):
                assert name in twins, f"{role}: {name} is not the twin of any `dsflash {role}` flag"
        if role == "gateway":
            assert args.port == port_named(container, "http")
            assert args.redis_url, "the gateway discovers workers through Redis"
            assert args.api_key, "the gateway must require API keys"
            # From the Secret that secret.example.yaml describes, and never optional: a missing
            # Secret must stop the pod, not start an open API.
            (key_ref,) = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "DSFLASH_API_KEY"]
            example = load_docs(K8S / "secret.example.yaml")[0]
            assert key_ref["name"] == example["metadata"]["name"] and key_ref["key"] in example["stringData"]
            assert not key_ref.get("optional", False)
            continue
        assert args.port == port_named(container, "grpc")
        assert args.metrics_port == port_named(container, "metrics") != 0
        assert args.advertise == FAKE_POD_IP, "workers must register their pod IP"
        assert args.redis_url
        gpus = [g for g in args.gpus.split(",") if g]
        assert gpus == [str(i) for i in range(len(gpus))], "inside the pod GPUs are numbered 0..N-1"
        limits = container["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == len(gpus), f"{role}: --gpus and nvidia.com/gpu disagree"
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert args.checkpoint == CHECKPOINT_MOUNT and mounts[CHECKPOINT_MOUNT].get("readOnly") is True
        transports = args.kv_transports.split(",")
        assert set(transports) <= {"rdma", "shm", "tcp"} and "tcp" in transports, transports
        rdma_resources = [name for name in limits if name.startswith("rdma/")]
        caps = container["securityContext"].get("capabilities", {}).get("add", [])
        if "rdma" in transports:
            assert rdma_resources and "IPC_LOCK" in caps, f"{role}: rdma needs an RDMA device and IPC_LOCK"
        else:
            assert not rdma_resources and not caps, f"{role}: RDMA resources requested but rdma not offered"
    assert seen_roles == set(ROLES), f"manifests run {sorted(seen_roles)}"


def test_container_command_lines_parse_with_the_real_cli(monkeypatch):
    check_command_lines(base_docs(), monkeypatch)


def test_configmaps_hold_only_flag_twins():
    all_twins = set().union(*(flag_twins(role) for role in ROLES))
    for cm in by_kind(base_docs(), "ConfigMap").values():
        for key, value in cm["data"].items():
            assert key in all_twins, f"{cm['metadata']['name']}: {key} is not a DSFLASH_* flag twin"
            assert isinstance(value, str), f"{key}: ConfigMap values must be strings"


def test_memory_requests_cover_the_host_memory_dsflash_allocates(monkeypatch):
    docs = base_docs()
    for _dep, pod, container in dsflash_containers(docs):
        role = role_of(container)
        if role not in WORKERS:
            continue
        args = parse_container(container, docs, monkeypatch)
        needed = args.pool_bytes + (args.host_cache_bytes if role == "decode" else 0)
        shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        needed += sum(quantity(v["emptyDir"]["sizeLimit"]) for v in shm)  # tmpfs counts as pod memory
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert quantity(requests["memory"]) >= needed * 1.1, f"{role}: memory request below pool+cache+shm+10%"
        assert requests == limits, f"{role}: GPU workers should be Guaranteed QoS (requests == limits)"
        assert "/dev/shm" in {m["mountPath"] for m in container["volumeMounts"]}


# ---------------------------------------------------------------- probes and shutdown

def test_every_serving_container_has_startup_readiness_and_liveness_probes():
    for dep in by_kind(base_docs(), "Deployment").values():
        for container in dep["spec"]["template"]["spec"]["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in container, f"{dep['metadata']['name']}/{container['name']} lacks {probe}"


def test_workers_probe_grpc_health_on_their_grpc_port(monkeypatch):
    from dsflash.v1 import worker_pb2

    services = {s.full_name for s in worker_pb2.DESCRIPTOR.services_by_name.values()}
    assert set(GRPC_SERVICES.values()) <= services
    docs = base_docs()
    for _dep, pod, container in dsflash_containers(docs):
        role = role_of(container)
        if role not in WORKERS:
            continue
        port = parse_container(container, docs, monkeypatch).port
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[name]
            assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, f"{role} {name}"
            assert probe["grpc"]["port"] == port, f"{role} {name} probes port {probe['grpc']['port']}, serves {port}"
            assert probe["grpc"].get("service", "") in ("", GRPC_SERVICES[role])
        assert container["readinessProbe"]["grpc"]["service"] == GRPC_SERVICES[role]
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600, "loading 475 GiB needs ~1 h budget"
        live = container["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] >= 120, "liveness must tolerate a busy engine"
        assert pod["terminationGracePeriodSeconds"] > drain_grace_s() + 10, f"{role}: grace shorter than the drain"


def drain_grace_s() -> float:
    """WorkerSettings.drain_grace_s, read from the source (importing it would load torch)."""
    tree = ast.parse((ROOT / "dsflash" / "serving" / "worker.py").read_text())
    settings = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "WorkerSettings")
    field = next(n for n in settings.body if isinstance(n, ast.AnnAssign) and n.target.id == "drain_grace_s")
    return ast.literal_eval(field.value)


def test_gateway_probes_readyz_and_healthz(monkeypatch):
    docs = base_docs()
    for _dep, pod, container in dsflash_containers(docs):
        if role_of(container) != "gateway":
            continue
        port = parse_container(container, docs, monkeypatch).port
        paths = {}
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[name]["httpGet"]
            assert get["port"] in ("http", port) and port_named(container, "http") == port
            paths[name] = get["path"]
        assert paths == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
        assert container["lifecycle"]["preStop"], "the gateway waits for endpoint removal before stopping"
        assert pod["terminationGracePeriodSeconds"] >= 15


# ---------------------------------------------------------------- services, budgets, autoscaling

def pod_labels(docs: list[dict]) -> dict[str, tuple[dict, dict]]:
    return {name: (dep["spec"]["template"]["metadata"]["labels"], dep["spec"]["template"]["spec"])
            for name, dep in by_kind(docs, "Deployment").items()}


def selected(selector: dict, labels: dict) -> bool:
    match = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        match = match and labels.get(expr["key"]) in expr["values"]
    return match


def test_deployment_selectors_services_and_budgets_select_the_right_pods():
    docs = base_docs()
    pods = pod_labels(docs)
    for name, dep in by_kind(docs, "Deployment").items():
        assert selected(dep["spec"]["selector"], pods[name][0]), f"{name}: selector misses its own pods"
    for name, svc in by_kind(docs, "Service").items():
        targets = [spec for labels, spec in pods.values() if selected({"matchLabels": svc["spec"]["selector"]}, labels)]
        assert len(targets) == 1, f"service {name} selects {len(targets)} deployments"
        port_names = {p["name"] for c in targets[0]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"service {name}: no container port {port['targetPort']}"
        if name in ("dsflash-prefill", "dsflash-decode"):
            assert svc["spec"].get("clusterIP") == "None", f"{name} must be headless (per-pod gRPC addressing)"
    budgets = by_kind(docs, "PodDisruptionBudget")
    for role in ROLES:
        pdb = budgets[f"dsflash-{role}"]
        assert selected(pdb["spec"]["selector"], pods[f"dsflash-{role}"][0])


def test_each_pool_has_an_hpa_on_its_load_metric():
    from dsflash.metrics import Metrics

    exported = {family.name for family in Metrics().registry.collect()}
    docs = base_docs()
    deployments = by_kind(docs, "Deployment")
    hpas = {hpa["spec"]["scaleTargetRef"]["name"]: hpa for hpa in by_kind(docs, "HorizontalPodAutoscaler").values()}
    adapter = yaml.safe_load(load_docs(K8S / "monitoring" / "prometheus-adapter-config.example.yaml")[0]["data"]
                             ["config.yaml"])
    adapted = {rule["name"]["as"] for rule in adapter["rules"]}
    for role in ROLES:
        name = f"dsflash-{role}"
        assert name in hpas, f"no HorizontalPodAutoscaler targets {name}"
        ref = hpas[name]["spec"]["scaleTargetRef"]
        assert (ref["kind"], ref["apiVersion"]) == ("Deployment", "apps/v1") and name in deployments
        # Re-applying the manifests must not reset what the HPA chose.
        assert "replicas" not in deployments[name]["spec"], f"{name}: replicas is owned by its HPA"
    metrics = {role: hpas[f"dsflash-{role}"]["spec"]["metrics"] for role in ROLES}
    pods_metrics = {role: {m["pods"]["metric"]["name"]: m["pods"]["metric"] for m in ms if m["type"] == "Pods"}
                    for role, ms in metrics.items()}
    assert "dsflash_prefill_queue_tokens" in pods_metrics["prefill"]
    assert "dsflash_requests_running" in pods_metrics["decode"]
    assert any(m["type"] == "Resource" and m["resource"]["name"] == "cpu" for m in metrics["decode"])
    for role, used in pods_metrics.items():
        for name, metric in used.items():
            # prometheus_client lists gauges under their own name (counters without _total).
            assert name in exported, f"HPA {role} scales on {name}, which dsflash does not export"
            assert name in adapted, f"no prometheus-adapter rule serves {name}"
            assert metric["selector"]["matchLabels"] == {"role": role}


def test_network_policies_allow_what_the_tiers_use():
    docs = base_docs()
    policies = by_kind(docs, "NetworkPolicy")
    redis_ports = {p["port"] for rule in policies["dsflash-redis"]["spec"]["ingress"] for p in rule["ports"]}
    assert redis_ports == {6379} and "redis://dsflash-redis:6379/" in by_kind(docs, "ConfigMap")[
        "dsflash-common"]["data"]["DSFLASH_REDIS_URL"]
    workers = policies["dsflash-workers"]["spec"]
    pods = pod_labels(docs)
    for role in WORKERS:
        assert selected(workers["podSelector"], pods[f"dsflash-{role}"][0])
    # dsflash pods reach the workers on every port: the KV data port is picked at start.
    assert any("ports" not in rule for rule in workers["ingress"])
    for labels, _spec in pods.values():
        assert labels["app.kubernetes.io/part-of"] == "dsflash"
    metrics_ports = {p["port"] for rule in workers["ingress"] for p in rule.get("ports", [])}
    for _dep, _pod, container in dsflash_containers(docs):
        if role_of(container) in WORKERS:
            assert port_named(container, "metrics") in metrics_ports


def test_podmonitors_scrape_named_ports_of_existing_pods():
    pods = pod_labels(base_docs())
    for monitor in load_docs(K8S / "monitoring" / "podmonitors.yaml"):
        targets = [spec for labels, spec in pods.values() if selected(monitor["spec"]["selector"], labels)]
        assert targets, f"{monitor['metadata']['name']} selects no pods"
        for spec in targets:
            names = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                assert endpoint["port"] in names


def test_deploy_docs_grpc_examples_match_the_protos():
    from google.protobuf import json_format

    from dsflash.gateway.chat_encoding import encode_chat
    from dsflash.gateway.tokenizer import load_tokenizer
    from dsflash.v1 import worker_pb2

    text = (ROOT / "docs" / "deploy.md").read_text()
    bodies = re.findall(r"-d '(\{.*?\})' localhost:\d+ ([\w./]+)", text, flags=re.S)
    requests = {"grpc.health.v1.Health/Check": None, "dsflash.v1.Decode/Generate": worker_pb2.GenerateRequest}
    assert {method for _body, method in bodies} == set(requests)
    for body, method in bodies:
        if requests[method] is not None:
            request = json_format.Parse(body, requests[method]())  # unknown fields fail here
            prompt = encode_chat(load_tokenizer(), [{"role": "user", "content": "Say hello in French."}],
                                 thinking=False)
            assert list(request.token_ids) == prompt.token_ids, "the documented token ids are stale"
    client = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    compile(client, "docs/deploy.md", "exec")
    for service in GRPC_SERVICES.values():
        assert service in text


# ---------------------------------------------------------------- rendered by kustomize

def kustomize(tmp_path: Path, components: list[str]) -> list[dict]:
    """Render k8s/ (plus components) the way `kubectl apply -k` would."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not on PATH")
    rel = Path(*[".."] * len(tmp_path.parts[1:])) / K8S.relative_to("/")
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": [str(rel)], "components": [str(rel / c) for c in components]}))
    out = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.mark.parametrize("components", [[], ["components/no-rdma"]], ids=["rdma", "no-rdma"])
def test_rendered_kustomization_is_valid_and_consistent(tmp_path, monkeypatch, components):
    docs = kustomize(tmp_path, components)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    assert len(docs) == len(base_docs())
    check_command_lines(docs, monkeypatch)
    transports = by_kind(docs, "ConfigMap")["dsflash-worker"]["data"]["DSFLASH_KV_TRANSPORTS"]
    assert transports == ("tcp" if components else "rdma,tcp")
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    tag = next(i for i in kust["images"] if i["name"] == "dsflash")
    for _dep, _pod, container in dsflash_containers(docs):
        assert container["image"] == f"{tag['newName']}:{tag['newTag']}"
        if not components and role_of(container) in WORKERS:
            assert container["securityContext"]["runAsUser"] == 0  # IPC_LOCK is only effective for root
        else:
            assert container["securityContext"].get("runAsUser", 10001) == 10001


# ---------------------------------------------------------------- the image

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        if raw.lstrip().startswith("#"):  # Docker drops comment lines, even inside a continuation
            continue
        continued = raw.rstrip().endswith("\\")
        current += raw.rstrip().removesuffix("\\") + " "
        if not continued:
            if current.strip():
                word, _, rest = current.strip().partition(" ")
                lines.append((word.upper(), rest.strip()))
            current = ""
    return lines


def dockerfile_args() -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in dockerfile() if word == "ARG" and "=" in rest)


def test_dockerfile_entrypoint_is_dsflash_and_roles_come_from_args():
    entry = [json.loads(rest) for word, rest in dockerfile() if word == "ENTRYPOINT"]
    assert len(entry) == 1 and entry[0][-1] == "dsflash", "exec-form ENTRYPOINT ending in dsflash"
    assert Path(entry[0][0]).name == "tini", "PID 1 must forward SIGTERM to dsflash"
    roles = set()
    for dep, _pod, container in dsflash_containers(base_docs()):
        assert "command" not in container, f"{dep['metadata']['name']}: keep the image's entrypoint"
        roles.add(role_of(container))
    assert roles == set(ROLES)


def test_dockerfile_python_and_torch_match_the_project():
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    args = dockerfile_args()
    assert args["PYTHON_VERSION"] in SpecifierSet(project["requires-python"])
    text = (ROOT / "Dockerfile").read_text()
    assert "lib/python${PYTHON_VERSION}/site-packages/pyverbs" in text
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch=="))
    assert f"torch=={args['TORCH_VERSION']}" == torch_pin, "Dockerfile TORCH_VERSION drifted from pyproject.toml"


def test_dockerfile_copies_everything_setup_py_installs():
    tree = ast.parse((ROOT / "setup.py").read_text())
    top_level = next(ast.literal_eval(n.value) for n in tree.body
                     if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "TOP_LEVEL")
    copied = set()
    for word, rest in dockerfile():
        if word == "COPY" and not rest.startswith("--from"):
            copied.update(rest.split()[:-1])
    needed = {"pyproject.toml", "setup.py", "README.md", "protos", "dsflash", *top_level}
    assert needed <= copied, f"not copied into the image: {sorted(needed - copied)}"
    ignored = dockerignore()
    for path in sorted(needed):
        assert not ignored(path), f".dockerignore excludes {path}, which the build needs"
    for path in (".git", ".venv", "tests", "dsflash/v1", "model/__pycache__/x.pyc", "ckpt/model.safetensors"):
        assert ignored(path), f".dockerignore should exclude {path}"


def declared_packages(monkeypatch) -> set[str]:
    """What setup.py's package_map() declares, without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    keep = [node for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
            or (isinstance(node, ast.FunctionDef) and node.name == "package_map")
            or (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("ROOT", "TOP_LEVEL"))]
    namespace = {"__file__": str(ROOT / "setup.py")}
    monkeypatch.chdir(ROOT)  # find_packages(where=top) is relative to the working directory
    exec(compile(ast.Module(body=keep, type_ignores=[]), "setup.py", "exec"), namespace)
    return set(namespace["package_map"]()[0])


def test_setup_py_installs_every_package_the_tiers_import(monkeypatch):
    # The image installs dsflash non-editable, so a package setup.py does not declare is simply
    # absent there, while editable checkouts (and so every other test) still find it.
    tree = ast.parse((ROOT / "setup.py").read_text())
    top_level = next(ast.literal_eval(n.value) for n in tree.body
                     if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "TOP_LEVEL")
    present = set()
    for base, prefix in [(ROOT / "dsflash", "dsflash")] + [(ROOT / top, f"dsflash.{top}") for top in top_level]:
        for init in base.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                present.add(".".join([prefix, *init.parent.relative_to(base).parts]))
    missing = present - declared_packages(monkeypatch)
    assert not missing, f"setup.py does not install {sorted(missing)}"


def test_dockerfile_ports_and_user_match_the_manifests():
    exposed = {int(p) for word, rest in dockerfile() if word == "EXPOSE" for p in rest.split()}
    docs = base_docs()
    used = {p["containerPort"] for _d, _p, c in dsflash_containers(docs) for p in c["ports"]}
    assert exposed == used
    user = [rest for word, rest in dockerfile() if word == "USER"][-1]
    gateway = by_kind(docs, "Deployment")["dsflash-gateway"]["spec"]["template"]["spec"]["securityContext"]
    assert user.isdigit() and int(user) == gateway["runAsUser"], "numeric USER, so runAsNonRoot can verify it"
    # The device plugin sets it per pod; an image-wide value could hand GPUs to the gateway.
    assert not any(word == "ENV" and "NVIDIA_VISIBLE_DEVICES" in rest for word, rest in dockerfile())


def dockerignore():
    """A predicate: is this context path excluded? Docker's rules: patterns anchored at the
    context root, `*` within a path segment, `**` across segments, a matched directory takes
    its contents along, and the last matching line (`!` re-includes) wins."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        for i, part in enumerate(pattern.split("/")):
            if part == "**":
                regex += "(?:[^/]+/)*"
                continue
            regex += re.escape(part).replace(r"\*", "[^/]*").replace(r"\?", "[^/]") + "/"
        rules.append((re.compile("^" + regex.rstrip("/") + "(?:/.*)?$"), negate))

    def ignored(path: str) -> bool:
        result = False
        for regex, negate in rules:
            if regex.match(path):
                result = not negate
        return result

    return ignored
