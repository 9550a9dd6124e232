"""The deploy files (issue #36, part 4), checked offline: Docker does not run here.

- ``infra/compose.yaml`` against the Compose Specification's JSON schema (vendored, tests/deploy_schemas/);
- ``infra/k8s/*.yaml`` against the Kubernetes OpenAPI schemas ``kubernetes-validate`` ships (strict: an
  unknown field is an error);
- ``Dockerfile`` parsed with ``dockerfile-parse``: a non-root USER, a HEALTHCHECK on /metrics, torch pinned
  and installed before the package, the console script as entrypoint, every COPY source present and not
  excluded by ``.dockerignore``;
- ``infra/systemd/*.service``: SIGTERM, a restart policy, a stop timeout that covers the worker's drain.

Across all of them: every ``CHANNEL_HEALTH_*`` name given to a channel-health process is one that
``pipeline.config.load_settings`` reads (recorded from a real call, not a list kept by hand), and every
command line is a real ``channel-health`` command with real options (parsed by the CLI's own click objects).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer
import yaml

from pipeline.cli.main import app
from pipeline.config import load_settings
from pipeline.stream.runtime import STOP_LIMIT_S

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
IMAGE_PREFIXES = ("channel-health:", "registry.example.com/channel-health:")
#: Kubernetes version the manifests are validated for (a schema kubernetes-validate ships).
K8S_VERSION = "1.33.0"


class _RecordingEnv(dict):
    """An empty environment that records every name looked up."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.seen.add(key)
        return super().__contains__(key)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)


def config_names() -> set[str]:
    """Every environment name ``load_settings`` reads."""
    env = _RecordingEnv()
    load_settings(env)
    return env.seen


def test_config_names_are_recorded_from_load_settings():
    names = config_names()
    assert {"CHANNEL_HEALTH_KAFKA_BOOTSTRAP", "CHANNEL_HEALTH_CLICKHOUSE_PASSWORD_FILE",
            "CHANNEL_HEALTH_CONTROL_KEYS", "CHANNEL_HEALTH_METRICS_PORT", "CHANNEL_HEALTH_PARTITIONS"} <= names
    assert "CHANNEL_HEALTH_CLICKHOUSE_PASSWORD_FILES" not in names


class CliMismatch(ValueError):
    """A command line names a command or an option the ``channel-health`` CLI does not have."""


def check_cli(argv: list[str]) -> None:
    """Parse ``channel-health ARGV`` with the CLI's own click objects (typer's); raises :class:`CliMismatch`
    for an unknown command or option, or a missing required one (nothing runs)."""
    cmd: Any = typer.main.get_command(app)
    args = list(argv)
    while hasattr(cmd, "commands"):
        if not args or args[0] not in cmd.commands:
            raise CliMismatch(f"{argv}: no such command {args[:1]}")
        cmd = cmd.commands[args.pop(0)]
    try:
        cmd.make_context("channel-health", args)
    except Exception as exc:  # typer vendors click: its UsageError is not click's
        raise CliMismatch(f"{argv}: {exc}") from exc


def test_check_cli_refuses_unknown_commands_and_options():
    check_cli(["worker", "--loglevel", "info"])
    check_cli(["topics", "ensure"])
    for argv in (["worker", "--log-level", "info"], ["workers"], ["alert"], ["topics"]):
        with pytest.raises(CliMismatch):
            check_cli(argv)


def assert_names_known(names: set[str], where: str) -> None:
    unknown = sorted(names - config_names())
    assert unknown == [], f"{where}: not read by pipeline/config.py: {unknown}"


# -- compose ---------------------------------------------------------------------------------------------------

def compose() -> dict[str, Any]:
    return yaml.safe_load((INFRA / "compose.yaml").read_text())


def ours(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services.items() if str(s.get("image", "")).startswith(IMAGE_PREFIXES)}


def test_compose_file_is_valid_against_the_compose_spec():
    schema = json.loads((REPO / "tests" / "deploy_schemas" / "compose-spec.json").read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(compose())]
    assert errors == []


def test_compose_schema_check_can_fail():
    schema = json.loads((REPO / "tests" / "deploy_schemas" / "compose-spec.json").read_text())
    bad = compose()
    bad["services"]["worker-1"]["stop_grace_periodd"] = "15s"
    assert not jsonschema.Draft7Validator(schema).is_valid(bad)


def test_compose_runs_kafka_kraft_clickhouse_two_workers_alert_prometheus_grafana():
    services = compose()["services"]
    assert set(services) == {"kafka", "clickhouse", "worker-1", "worker-2", "alert", "prometheus", "grafana"}
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller" and not any("ZOOKEEPER" in k for k in kafka)
    workers = [s for s in ours(services).values() if s["command"][0] == "worker"]
    assert len(workers) == 2
    assert {w["environment"]["CHANNEL_HEALTH_CONSUMER_GROUP"] for w in workers} == {"channel-health"}
    assert all(w["environment"]["CHANNEL_HEALTH_CLICKHOUSE_URL"].startswith("http://") for w in workers)  # not chDB
    assert int(workers[0]["environment"]["CHANNEL_HEALTH_PARTITIONS"]) >= len(workers)
    prometheus = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{name}:{s['environment']['CHANNEL_HEALTH_METRICS_PORT']}" for name, s in ours(services).items()}


def test_compose_channel_health_services_use_known_settings_commands_and_a_drain_long_enough():
    services = ours(compose()["services"])
    assert set(services) == {"worker-1", "worker-2", "alert"}
    for name, service in services.items():
        assert_names_known(set(service["environment"]), f"compose {name}")
        check_cli(service["command"])
        grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
        assert grace and int(grace.group(1)) > STOP_LIMIT_S
        for var, value in service["environment"].items():
            if var.endswith("_FILE") or var == "CHANNEL_HEALTH_CONTROL_KEYS":  # secrets come as files only
                assert value.startswith("/run/secrets/") and value.removeprefix("/run/secrets/") in service["secrets"]
        assert not any("PASSWORD" in var and not var.endswith("_FILE") for var in service["environment"])


def test_compose_mounted_files_exist():
    doc = compose()
    for service in doc["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (INFRA / source).exists(), source
    assert (INFRA / doc["configs"]["alerts"]["file"]).is_file()
    dashboards = INFRA / "grafana" / "dashboards"
    assert list(dashboards.glob("*.json"))


def test_compose_alert_config_parses_with_its_secret_file(tmp_path):
    from pipeline.alert.config import parse_alert_config

    text = (INFRA / "compose" / "alerts.toml").read_text()
    (tmp_path / "alert_webhook_url").write_text("https://hooks.slack.com/services/T/B/X\n")
    config = parse_alert_config(tomllib.loads(text.replace("/run/secrets/", f"{tmp_path}/")), {})
    assert [r.url for r in config.routes] == ["https://hooks.slack.com/services/T/B/X"]


# -- Kubernetes ------------------------------------------------------------------------------------------------

def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted((INFRA / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


@pytest.mark.parametrize("name, doc", k8s_docs(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_k8s_manifest_is_valid_for_kubernetes(name, doc):
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_k8s_validation_can_fail():
    import kubernetes_validate

    deployment = next(doc for _n, doc in k8s_docs() if doc["kind"] == "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_kustomization_lists_existing_files_and_not_the_example_secret():
    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    assert all((INFRA / "k8s" / r).is_file() for r in kustomization["resources"])
    assert "secret.example.yaml" not in kustomization["resources"]


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _n, doc in k8s_docs() if doc["kind"] == kind}


def test_k8s_settings_from_the_configmap_secrets_from_secret_files_commands_real():
    configmaps, secrets = _by_kind("ConfigMap"), _by_kind("Secret")
    assert_names_known(set(configmaps["channel-health"]["data"]), "ConfigMap channel-health")
    assert not any("PASSWORD" in k and not k.endswith("_FILE") for k in configmaps["channel-health"]["data"])
    for name, deployment in _by_kind("Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["terminationGracePeriodSeconds"] > STOP_LIMIT_S
        mounts = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            check_cli(container["args"])
            assert [e["configMapRef"]["name"] for e in container["envFrom"]] == ["channel-health"]
            assert_names_known({e["name"] for e in container["env"]}, f"{name} env")
            paths = {}
            for m in container["volumeMounts"]:
                volume = mounts[m["name"]]
                if "secret" in volume:
                    secret = secrets[volume["secret"]["secretName"]]
                    keys = [i["path"] for i in volume["secret"].get("items", [])] or list(secret["stringData"])
                    paths.update({f"{m['mountPath']}/{k}": k for k in keys})
            for e in container["env"]:  # every secret setting points at a file the Secret provides
                assert "value" in e and e["value"] in paths, (name, e)
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
            port = configmaps["channel-health"]["data"]["CHANNEL_HEALTH_METRICS_PORT"]
            assert [p["containerPort"] for p in container["ports"]] == [int(port)]


def test_k8s_workers_scale_with_partitions_and_have_a_disruption_budget():
    worker = _by_kind("Deployment")["channel-health-worker"]
    partitions = int(_by_kind("ConfigMap")["channel-health"]["data"]["CHANNEL_HEALTH_PARTITIONS"])
    assert 2 <= worker["spec"]["replicas"] <= partitions
    pdb = _by_kind("PodDisruptionBudget")["channel-health-worker"]
    assert pdb["spec"]["selector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_k8s_alert_config_parses_with_its_secret_files(tmp_path):
    from pipeline.alert.config import parse_alert_config

    text = _by_kind("ConfigMap")["channel-health-alert"]["data"]["alerts.toml"]
    secret = _by_kind("Secret")["channel-health-alert"]["stringData"]
    for key, value in secret.items():
        (tmp_path / key).write_text(value)
    config = parse_alert_config(tomllib.loads(text.replace("/etc/channel-health/alert-secrets/", f"{tmp_path}/")), {})
    assert [r.name for r in config.routes] == ["team-slack", "pager"]


# -- Dockerfile ------------------------------------------------------------------------------------------------

def dockerfile() -> list[dict[str, Any]]:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(fileobj=(REPO / "Dockerfile").open("rb"))
    return parser.structure


def test_dockerfile_user_healthcheck_entrypoint():
    steps = dockerfile()
    users = [s["value"] for s in steps if s["instruction"] == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    health = [s["value"] for s in steps if s["instruction"] == "HEALTHCHECK"]
    assert len(health) == 1 and "/metrics" in health[0] and "CHANNEL_HEALTH_METRICS_PORT" in health[0]
    env = " ".join(s["value"] for s in steps if s["instruction"] == "ENV")
    assert "CHANNEL_HEALTH_METRICS_HOST=0.0.0.0" in env and "CHANNEL_HEALTH_METRICS_PORT=9464" in env
    assert [json.loads(s["value"]) for s in steps if s["instruction"] == "ENTRYPOINT"] == [["channel-health"]]
    check_cli([json.loads(s["value"]) for s in steps if s["instruction"] == "CMD"][-1])
    assert [s["value"] for s in steps if s["instruction"] == "STOPSIGNAL"] == ["SIGTERM"]


def test_dockerfile_installs_cpu_torch_pinned_before_the_package():
    runs = [s["value"] for s in dockerfile() if s["instruction"] == "RUN"]
    torch = [i for i, r in enumerate(runs) if "torch==" in r]
    package = [i for i, r in enumerate(runs) if re.search(r"pip install -e '\.\[quality\]'", r)]
    assert len(torch) == 1 and len(package) == 1 and torch[0] < package[0]
    makefile_pin = re.search(r"pip install (torch==[\d.]+)", (REPO / "Makefile").read_text()).group(1)
    assert makefile_pin in runs[torch[0]] and "download.pytorch.org/whl/cpu" in runs[torch[0]]
    assert makefile_pin.split("==")[1] in (REPO / "pyproject.toml").read_text()


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") or path == p for p in patterns)


def test_dockerfile_copies_exist_are_not_dockerignored_and_keep_the_ddl_beside_the_package():
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    copies = [shlex.split(s["value"]) for s in dockerfile() if s["instruction"] == "COPY"]
    sources = [c[0] for c in copies]
    for source in sources:
        assert (REPO / source).exists() and not _ignored(source, patterns), source
    # pipeline/storage/schema.py finds the DDL at <package's parent>/infra/clickhouse, the model at models/.
    targets = {c[0]: c[1] for c in copies}
    assert targets["pipeline"] == "./pipeline" and targets["infra/clickhouse"] == "./infra/clickhouse"
    assert targets["models"] == "./models"
    from pipeline.storage.schema import DEFAULT_DDL_DIR

    assert DEFAULT_DDL_DIR == REPO / "infra" / "clickhouse"
    assert all(_ignored(p, patterns) for p in (".venv", "data", ".git", "tests"))


# -- systemd ---------------------------------------------------------------------------------------------------

def unit(path: Path) -> dict[str, list[str]]:
    """``Key=value`` lines of a unit file, as lists (keys may repeat)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("name", ["channel-health-worker@.service", "channel-health-alert.service"])
def test_systemd_unit_stops_with_sigterm_within_the_drain_and_restarts(name):
    u = unit(INFRA / "systemd" / name)
    assert u["KillSignal"] == ["SIGTERM"] and u["KillMode"] == ["mixed"]
    assert u["Restart"] == ["on-failure"]
    assert STOP_LIMIT_S < int(u["TimeoutStopSec"][0]) <= 30
    assert u["User"] != ["root"]
    command = shlex.split(u["ExecStart"][0])
    if command[0] == "/bin/sh":  # sh -c '... exec BIN ARGS'
        command = shlex.split(command[2].split("exec ", 1)[1])
    assert command[0] == "/opt/channel-health/.venv/bin/channel-health"
    check_cli(command[1:])
    names = {e.split("=", 1)[0] for e in u.get("Environment", [])}
    names |= set(re.findall(r"\b(CHANNEL_HEALTH_[A-Z_]+)=", u["ExecStart"][0]))
    assert_names_known(names, name)
    credentials = {c.split(":", 1)[0] for c in u.get("LoadCredential", [])}
    for e in u.get("Environment", []):
        if e.startswith(("CHANNEL_HEALTH_CLICKHOUSE_PASSWORD_FILE=", "CHANNEL_HEALTH_CONTROL_KEYS=")):
            assert e.split("=", 1)[1].removeprefix("%d/") in credentials


def test_systemd_environment_file_example_uses_known_names():
    lines = [ln for ln in (INFRA / "systemd" / "channel-health.env.example").read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert_names_known({ln.split("=", 1)[0] for ln in lines}, "channel-health.env.example")


# -- docs/DEPLOY.md --------------------------------------------------------------------------------------------

def test_deploy_doc_commands_are_real():
    """Every ``channel-health ...`` command in the shell blocks of docs/DEPLOY.md parses; every repository
    path the page names exists."""
    text = (REPO / "docs" / "DEPLOY.md").read_text()
    flat = " ; ".join(re.findall(r"```bash\n(.*?)```", text, re.S)).replace("\n", " ; ")
    commands = re.findall(r"(?<![\w/.-])channel-health ((?:topics )?[a-z]+(?: --?[a-z-]+(?: [^\s`|&;]+)?)*)", flat)
    checked = 0
    for command in commands:
        argv = shlex.split(command)
        if argv[0] in {"worker", "alert", "topics", "query", "override"}:
            check_cli(argv)
            checked += 1
    assert checked >= 2
    for path in set(re.findall(r"(?:\.\./|\b)((?:infra|docs)/[\w./@-]+\.(?:yaml|yml|toml|md|service|example))", text)):
        assert (REPO / path).exists(), path
    assert re.search(r"^install:", (REPO / "Makefile").read_text(), re.M)
