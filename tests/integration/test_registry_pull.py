"""The image pull of the launch role (hostnet.llamafactory.image_pull) against a private registry
on the session cluster's VPC: Debian's docker-registry with TLS and a user and password, the
stand-in for Artifact Registry (tools/localcluster/registry.py). The full 2 GB pull followed by
training runs in the molecule scenario `launch`.
"""

import json
import subprocess

import pytest
from conftest import run_playbook
from localcluster import cluster, images, registry

pytestmark = pytest.mark.cluster  # brings up a local cluster

PLAY = """
- name: Pull like the launch role
  hosts: llamafactory
  gather_facts: false
  tasks:
    - name: Pull
      hostnet.llamafactory.image_pull:
        name: "{{ image }}"
        username: "{{ user | default(omit) }}"
        password: "{{ secret | default(omit) }}"
        timeout: "{{ pull_timeout | default(600) }}"
        interval: 0.5
        progress_every: 1
      become: true
"""


@pytest.fixture(scope="module")
def private(test_cluster):
    """(registry, the image the VMs pull, the inventory, the VMs' containers)."""
    definition, state = test_cluster
    client = cluster.client()
    found = registry.start(definition, client, cluster.cache_dir())
    image = registry.push(
        client, found, images.PLATFORMS["debian12"].image_of("blank"), "test/blank:1"
    )
    return found, image, state["inventory"], state["nodes"]


def pull(private, tmp_path, **extravars):
    found, image, inventory, _vms = private
    tmp_path.mkdir(parents=True, exist_ok=True)
    playbook = tmp_path / "pull.yml"
    playbook.write_text(PLAY)
    runner, _facts, results = run_playbook(
        inventory, tmp_path / "run", str(playbook), extravars={"image": image, **extravars}
    )
    outcome = {host: dict(items[-1]["res"], ok=items[-1]["ok"]) for host, items in results.items()}
    shown = "\n".join(event.get("stdout", "") for event in runner.events)
    everything = json.dumps(list(runner.events))
    assert found.password not in everything, "the registry password reached the play's output"
    return runner, outcome, shown


def on_vm(container, script):
    return subprocess.run(
        ["docker", "exec", container, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_private_image_is_pulled_once_with_credentials_that_stay_off_the_node(private, tmp_path):
    found, image, _inventory, nodes = private
    vms = [node["container"] for node in nodes]
    for vm in vms:
        on_vm(vm, f"docker rmi -f {image}")
    runner, outcome, shown = pull(
        private, tmp_path / "first", user=found.username, secret=found.password
    )
    assert runner.rc == 0, outcome
    for host, result in outcome.items():
        assert result["changed"] and result["state"] == "pulled", (host, result)
        assert result["credentials"] == "arguments"
        assert result["progress"]["layers_done"] == result["progress"]["layers"] >= 1
        assert f"[{host}] pulling {image} (llamafactory_pull_timeout 600 s" in shown
        assert f"[{host}] pulled {image}:" in shown
    for vm in vms:
        assert on_vm(vm, f"docker image inspect {image}").returncode == 0
        assert on_vm(vm, "test -e /root/.docker/config.json").returncode != 0  # no docker login
        records = on_vm(vm, "cat /run/hostnet-llamafactory/pulls/*.json").stdout
        assert found.password not in records and "trainer" not in records

    runner, outcome, _shown = pull(
        private, tmp_path / "again", user=found.username, secret=found.password
    )
    assert runner.rc == 0
    assert runner.stats["changed"] == {}
    assert all(result["state"] == "present" for result in outcome.values())


@pytest.mark.parametrize(
    ("secret", "expected"),
    [
        ("wrong-password", "unauthorized: authentication required"),
        (None, "no basic auth credentials"),
    ],
)
def test_refused_credentials_are_named(private, tmp_path, secret, expected):
    found, image, _inventory, nodes = private
    for node in nodes:
        on_vm(node["container"], f"docker rmi -f {image}")
    extravars = {"user": found.username, "secret": secret} if secret else {}
    runner, outcome, _shown = pull(private, tmp_path, **extravars)
    assert runner.rc != 0
    for result in outcome.values():
        assert not result["ok"]
        assert expected in result["msg"]
        assert f"the registry {found.address} refused the credentials" in result["msg"]
        assert "llamafactory_registry_username and llamafactory_registry_password" in result["msg"]


def test_a_registry_that_never_answers_hits_the_deadline(private, tmp_path):
    """A registry address that accepts connections and says nothing (a half-open firewall, an
    overloaded proxy): the pull is cancelled at the deadline, naming llamafactory_pull_timeout."""
    _found, _image, _inventory, nodes = private
    vms = [node["container"] for node in nodes]
    listener = (
        "import socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 5009)); s.listen(8)\n"
        "held = []\n"
        "s.settimeout(1)\n"
        "while True:\n"
        "    try:\n"
        "        held.append(s.accept()[0])\n"
        "    except OSError:\n"
        "        pass\n"
    )
    start = (
        f"cat > /root/silent.py <<'EOF'\n{listener}EOF\n"
        "nohup timeout 120 python3 /root/silent.py >/dev/null 2>&1 & echo $! > /run/silent.pid"
    )
    assert on_vm(vms[1], start).returncode == 0
    image = f"{nodes[1]['vpc_address']}:5009/test/never:1"
    try:
        runner, outcome, _shown = pull(private, tmp_path, image=image, pull_timeout=4)
    finally:
        on_vm(vms[1], "kill $(cat /run/silent.pid); rm -f /run/silent.pid /root/silent.py")
    assert runner.rc != 0
    for host, result in outcome.items():
        assert not result["ok"] and result.get("state") == "timed_out", (host, result)
        assert (
            f"the pull of {image} did not finish within llamafactory_pull_timeout (4 s)"
            in result["msg"]
        )
        assert "contacting the registry" in result["msg"]
    for vm in vms:
        # The background pull was stopped, and its record says so.
        record = json.loads(
            on_vm(vm, "cat $(grep -l never /run/hostnet-llamafactory/pulls/*.json)").stdout
        )
        assert record["state"] == "failed" and record["error"] == "cancelled"
        assert on_vm(vm, f"kill -0 {record['pid']}").returncode != 0


def test_bringing_the_cluster_up_again_keeps_it_and_its_registry(private, test_cluster):
    """`localcluster up` on a running cluster with its registry is a no-op (./dev demo --keep,
    then ./dev demo or ./dev bench): the registry shares the cluster's label but is no VM."""
    definition, state = test_cluster
    client = cluster.client()
    label = {"label": f"{cluster.CLUSTER_LABEL}={definition.name}"}
    before = {c.name: c.id for c in client.containers.list(filters=label)}
    assert f"hlf-{definition.name}-registry" in before
    again = cluster.up(definition)
    after = {c.name: c.id for c in client.containers.list(filters=label)}
    assert after == before and again["nodes"] == state["nodes"]
