"""A private registry on a cluster's VPC: Debian's docker-registry (distribution 2.8) behind TLS
and htpasswd, as a stand-in for Artifact Registry (which the tests cannot reach).

The registry listens on the VPC at .5 (port 5000); the VMs trust its CA through
/etc/docker/certs.d/<address>:5000/ca.crt, as a node trusts a private registry's CA. This machine
pushes to it through a port published on 127.0.0.1 only (Docker treats loopback registries as
insecure, so no CA is needed here). The container carries the cluster's label: `down` removes it.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import secrets
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import images
from .cluster import CLUSTER_LABEL, state_dir
from .util import ClusterError, log, run, stream, wait_until

REGISTRY_IMAGE = "hostnet-llamafactory/registry:2.8"
PORT = 5000
# The registry's storage outlives the clusters (like the cached images): an image is pushed once,
# until `localcluster rmi`. The registries of several clusters may share it.
STORAGE_VOLUME = "hostnet-llamafactory-registry-storage"
TRAIN_REPOSITORY = "hostnet/llamafactory:0.9.5-cpu"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
HOST_OFFSET = 5  # the registry's address on the VPC: .5
INSTALL = (
    "set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; "
    "apt-get install -y -qq --no-install-recommends docker-registry apache2-utils >/dev/null; "
    "apt-get clean; rm -rf /var/lib/apt/lists/*"
)
CONFIG = """version: 0.1
log: {level: info, formatter: text}
storage:
  filesystem: {rootdirectory: /var/lib/registry}
  delete: {enabled: true}
http:
  addr: ":5000"
  tls: {certificate: /conf/server.crt, key: /conf/server.key}
auth:
  htpasswd: {realm: hostnet-test, path: /conf/htpasswd}
"""


@dataclass(frozen=True)
class Registry:
    container: str
    address: str  # host:port as the VMs reach it
    local: str  # host:port as this machine reaches it
    username: str
    password: str
    ca: Path

    def image(self, repository: str) -> str:
        return f"{self.address}/{repository}"


def ensure_image(client, cache_dir: Path) -> str:
    base = images.ensure_vm_image(client, images.PLATFORMS["debian12"], cache_dir, kind="blank")
    wanted = images.inputs_hash(
        "registry/1", INSTALL, images.vm_inputs(images.PLATFORMS["debian12"], "blank")
    )
    if images.image_inputs(client, REGISTRY_IMAGE) == wanted:
        return REGISTRY_IMAGE
    log(f"image {REGISTRY_IMAGE}: building (Debian's docker-registry, about 30 s)")
    builder = f"hlf-build-registry-{wanted}"
    run(["docker", "rm", "-f", builder], check=False)
    try:
        stream(["docker", "run", "--name", builder, base, "sh", "-c", INSTALL], "  apt: ", 600)
        command = [
            "docker",
            "commit",
            "--change",
            "LABEL " + " ".join(images._labels("registry", wanted)),
        ]
        run([*command, builder, REGISTRY_IMAGE], timeout=300)
    finally:
        run(["docker", "rm", "-f", builder], check=False)
    return REGISTRY_IMAGE


def _certificates(folder: Path, address: str) -> None:
    """A CA and a server certificate for `address` (and 127.0.0.1), made with openssl."""
    ip = address.split(":")[0]
    ssl = ["openssl"]
    run(
        [
            *ssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=hostnet-llamafactory test CA",
            "-keyout",
            str(folder / "ca.key"),
            "-out",
            str(folder / "ca.crt"),
        ]
    )
    run(
        [
            *ssl,
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={ip}",
            "-keyout",
            str(folder / "server.key"),
            "-out",
            str(folder / "server.csr"),
        ]
    )
    (folder / "san.ext").write_text(f"subjectAltName=IP:{ip},IP:127.0.0.1\n")
    run(
        [
            *ssl,
            "x509",
            "-req",
            "-in",
            str(folder / "server.csr"),
            "-CA",
            str(folder / "ca.crt"),
            "-CAkey",
            str(folder / "ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(folder / "san.ext"),
            "-out",
            str(folder / "server.crt"),
        ]
    )
    for name in ("ca.key", "server.key"):
        (folder / name).chmod(0o644)  # read by the registry's own user in the container


def start(spec, client, cache_dir: Path, username: str = "trainer") -> Registry:
    """Start (or find) the cluster's registry and make every VM trust it."""
    vpc = spec.networks["vpc"]
    ip = str(ipaddress.ip_network(vpc.subnet).network_address + HOST_OFFSET)
    address = f"{ip}:{PORT}"
    name = f"{spec.prefix()}-registry"
    folder = state_dir(spec) / "registry"
    secret = folder / "password"
    if not secret.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        _certificates(folder, address)
        secret.write_text(secrets.token_urlsafe(18))
        secret.chmod(0o600)
    password = secret.read_text()
    image = ensure_image(client, cache_dir)
    if not client.volumes.list(filters={"name": STORAGE_VOLUME}):
        client.volumes.create(STORAGE_VOLUME, labels={images.IMAGE_LABEL: "registry-storage"})
    existing = client.containers.list(all=True, filters={"name": f"^{name}$"})
    if not existing:
        (folder / "config.yml").write_text(CONFIG)
        # htpasswd reads the password on stdin (-i), never from its command line.
        htpasswd = subprocess.run(
            ["docker", "run", "--rm", "-i", image, "htpasswd", "-Bin", username],
            input=password,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        (folder / "htpasswd").write_text(htpasswd)
        run(
            [
                "docker",
                "run",
                "-d",
                "--name",
                name,
                "--label",
                f"{CLUSTER_LABEL}={spec.name}",
                "-p",
                f"127.0.0.1::{PORT}",
                "-v",
                f"{folder}:/conf:ro",
                "-v",
                f"{STORAGE_VOLUME}:/var/lib/registry",
                image,
                "docker-registry",
                "serve",
                "/conf/config.yml",
            ]
        )
        run(["docker", "network", "connect", "--ip", ip, spec.network_name("vpc"), name])
    container = client.containers.get(name)
    port = container.attrs["NetworkSettings"]["Ports"][f"{PORT}/tcp"][0]["HostPort"]
    local = f"127.0.0.1:{port}"
    ca_path = folder / "ca.crt"
    wait_until(f"registry {name}", lambda: _get(local, ca_path, "/v2/")[0] == 401, deadline_s=60)
    ca = (folder / "ca.crt").read_bytes()
    for vm in spec.vms:
        vm_name = spec.container(vm)
        target = f"/etc/docker/certs.d/{address}"
        subprocess.run(
            [
                "docker",
                "exec",
                "-i",
                vm_name,
                "sh",
                "-c",
                f"mkdir -p {target} && cat > {target}/ca.crt",
            ],
            input=ca,
            check=True,
            timeout=60,
        )
    (folder / "address").write_text(address)
    log(f"registry {name}: {address} on the VPC, {local} here")
    return Registry(name, address, local, username, password, folder / "ca.crt")


def _get(registry_local: str, ca: Path, path: str, auth=None, accept: str | None = None):
    """GET https://<registry_local><path> verified against the test CA: (status, body)."""
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(f"https://{registry_local}{path}")
    if accept:
        request.add_header("Accept", accept)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:  # noqa: S310 (https, built here)
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return None, b""


def push(client, registry: Registry, source: str, repository: str) -> str:
    """Push a local image as <registry>/<repository> unless the registry has it (its manifest
    names the same image ID); returns the name the VMs pull."""
    local_name = f"{registry.local}/{repository}"
    repo, tag = local_name.rsplit(":", 1)
    path, wanted_tag = repository.rsplit(":", 1)
    status, body = _get(
        registry.local,
        registry.ca,
        f"/v2/{path}/manifests/{wanted_tag}",
        (registry.username, registry.password),
        accept=MANIFEST_V2,
    )
    if status == 200 and json.loads(body)["config"]["digest"] == client.images.get(source).id:
        log(f"registry: {repository} is {source} already")
        return registry.image(repository)
    client.images.get(source).tag(repo, tag)
    started = time.monotonic()
    auth = {"username": registry.username, "password": registry.password}
    for event in client.images.push(repo, tag, auth_config=auth, stream=True, decode=True):
        if event.get("error"):
            raise ClusterError(f"push of {source} to {local_name}: {event['error']}")
    client.images.remove(local_name, noprune=True)
    log(f"registry: pushed {source} as {repository} in {time.monotonic() - started:.0f} s")
    return registry.image(repository)


def pull_vars(registry: Registry, image: str) -> Path:
    """A 0600 vars file that points a job at `image` in this registry, with its credentials
    (for `ansible-playbook -e @FILE`: the password stays off the command line)."""
    path = registry.ca.parent / "pull-vars.yml"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(
        json.dumps(
            {
                "llamafactory_image": image,
                "llamafactory_registry_username": registry.username,
                "llamafactory_registry_password": registry.password,
            },
            indent=2,
        )
        + "\n"
    )
    return path
