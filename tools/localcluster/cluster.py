"""Bring a local cluster of GCP-like "VM" containers up, report on it, tear it down.

Each VM is a container running systemd as PID 1, its own dockerd (on a named volume) and sshd
(host keys generated at first boot). Its primary NIC sits on a simulated VPC, carries a GCP-like
name and the default route; the controller reaches it over a separate "external" network (its
"external IP"). Both NICs are filtered by the definition's VPC firewall rules with GCE's
semantics (gce_firewall.py): by default a fresh project's, which let SSH and ICMP in from
anywhere and everything in from the VPC.

The box's services run beside the VMs: the fake Compute Engine API (compute_service.py) and
Cloud Storage (gcs_service.py), whose storage.googleapis.com the VMs reach at the host's address
on their VPC network (their /etc/hosts), trusting the box's CA (in their system trust store).
Each VM gets the box's wheelhouse (images.ensure_wheelhouse: google-cloud-storage and its
dependencies) mounted read-only at WHEELHOUSE and an /etc/pip.conf that installs from it
offline, as the VMs here cannot reach PyPI; a VM on GCP reaches PyPI and needs neither.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import docker
import docker.errors
import yaml

from . import compute_service, gce_firewall, gce_metadata, gcs_service, images
from .spec import VM, ClusterSpec, machine_nics, repo_root, to_raw
from .util import ClusterError, log, pipe, run, wait_until

CLUSTER_LABEL = "hostnet.llamafactory.cluster"
SPEC_LABEL = "hostnet.llamafactory.cluster.spec"
VM_LABEL = "hostnet.llamafactory.vm"
# On the VMs made through the Compute Engine API (gce_control.ClusterBackend.insert), not the
# definition: `up` keeps them when it finds the cluster up as defined.
INSERTED_LABEL = "hostnet.llamafactory.vm.inserted"
EXTERNAL_NIC = "ext0"
BOOT_DEADLINE_S = 120
# --privileged fails where the host lacks CAP_SYS_RESOURCE: every other capability instead.
CAP_DROP = ["SYS_RESOURCE"]
# systemd and dockerd in a VM take 8 inotify instances (measured, test-machine.md).
INOTIFY_PER_VM = 8
INOTIFY_SPARE = 16
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
# The kernel's ARP table is one for every network namespace, so all VMs share its limits
# (gc_thresh3 1024 by default: 32 VMs that all reach each other overflow it, and connections
# time out). A VM learns each peer on its VPC and on ext0, and a few more (gateway, registry,
# its docker0): 2 per VM of its cluster, plus 16.
NEIGH_SYSCTL = Path("/proc/sys/net/ipv4/neigh/default")
NEIGH_STATS = Path("/proc/net/stat/arp_cache")
NEIGH_PER_PEER = 2
NEIGH_SPARE = 16
WHEELHOUSE = "/var/cache/hlf-wheelhouse"
BOX_CA = "/usr/local/share/ca-certificates/hostnet-box.crt"


def cache_dir() -> Path:
    return Path(os.environ.get("HLF_CACHE_DIR", repo_root() / ".cache"))


def state_dir(spec: ClusterSpec) -> Path:
    return cache_dir() / "localcluster" / spec.name


@contextlib.contextmanager
def state_lock(directory: Path):
    """Hold STATE_DIR/state.lock (flock, exclusive) while reading and rewriting state.json: the
    fake API's operations (threads of one process) and the CLI may write it at once. Not
    re-entrant: take it around a read-modify-write, never around slow work."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "state.lock", "a") as handle:  # a descriptor of its own: threads too
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_state(directory: Path, state: dict) -> None:
    """state.json replaced at once (readers never see half of it)."""
    path = directory / "state.json"
    tmp = path.with_name(f".state.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def spec_hash(spec: ClusterSpec) -> str:
    text = json.dumps(asdict(spec), default=str, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def client() -> docker.DockerClient:
    try:
        docker_client = docker.from_env(timeout=300)
        docker_client.ping()
    except docker.errors.DockerException as exc:
        raise ClusterError(
            f"Docker does not answer ({exc}): start dockerd, or run .ci/run once "
            "to install and start it"
        ) from exc
    return docker_client


def _labels(spec: ClusterSpec, **extra: str) -> dict[str, str]:
    return {CLUSTER_LABEL: spec.name, **extra}


def _vm_networks(spec: ClusterSpec, vm: VM) -> list[tuple[str, str]]:
    """(network role, interface name inside the VM), primary first."""
    pairs = [("vpc", vm.nic), ("external", EXTERNAL_NIC)]
    if vm.second_nic:
        pairs.append(("secondary", vm.second_nic))
    if vm.decoy:
        pairs.append(("decoy", vm.decoy))
    # A GPU machine type's other NICs (spec.machine_nics: control1, gpu0.., rdma0..), each on a
    # network of its own; the rename below goes by MAC, whatever their number.
    pairs += [(nic.role, nic.name) for nic in machine_nics(vm) if nic.role != "vpc"]
    return pairs


# Stand-ins for the devices a GPU machine type's ranks open (no such hardware here): the tcpxo
# types' /dev/aperture_devices/<BDF> (each GPU NIC's PCI function 1, as Google's udev rule
# bind-mounts them; here an empty directory each) and /dev/dmabuf_import_helper, and the gib
# types' /dev/infiniband/uverbs0..7
# (character devices 1:3, /dev/null's numbers: opening one works and does nothing). /dev is a
# fresh tmpfs at every container start, so configure_network makes them again each time.
def standin_devices_script(vm: VM) -> str:
    layout = vm.layout
    if not layout:
        return ""
    if layout["profile"] == "tcpxo":
        # And dmabuf-import-helper's device, which RxDM opens (1:3 as well).
        functions = [slot[:-1] + "1" for slot in layout["gpu_nic_slots"]]
        return "".join(f"mkdir -p /dev/aperture_devices/{bdf}\n" for bdf in functions) + (
            "[ -c /dev/dmabuf_import_helper ] || mknod -m 0666 /dev/dmabuf_import_helper c 1 3\n"
        )
    return "mkdir -p /dev/infiniband\n" + "".join(
        f"[ -c /dev/infiniband/uverbs{i} ] || mknod -m 0666 /dev/infiniband/uverbs{i} c 1 3\n"
        for i in range(len(layout["gpu_nic_names"]))
    )


# ---------------------------------------------------------------- up


def up(spec: ClusterSpec) -> dict:
    """Create the cluster (or keep it when it is already up as defined); return its state."""
    started = time.monotonic()
    docker_client = client()
    wanted = spec_hash(spec)
    existing = docker_client.containers.list(
        all=True, filters={"label": f"{CLUSTER_LABEL}={spec.name}"}
    )
    if existing:
        # The VMs decide; the cluster's registry (same cluster label) is kept along with them,
        # and so are the VMs the Compute Engine API made (in state.json, not the definition).
        vms = [c for c in existing if VM_LABEL in c.labels and INSERTED_LABEL not in c.labels]
        same = all(c.labels.get(SPEC_LABEL) == wanted and c.status == "running" for c in vms)
        if same and len(vms) == len(spec.vms) and (state_dir(spec) / "state.json").exists():
            log(f"cluster {spec.name}: already up as defined")
            state = start_services(spec)
            _check_ssh(state)
            write_inventory(spec, state)
            return state
        log(f"cluster {spec.name}: exists with another definition or stopped; recreating")
        down(spec)

    # The default platform's image too, for the VMs the API creates (an empty project has none).
    for platform in sorted({vm.platform for vm in spec.vms} | {"debian12"}):
        images.ensure_vm_image(docker_client, images.PLATFORMS[platform], cache_dir())
    probe = images.ensure_probe_image(docker_client, cache_dir())
    wheelhouse = images.ensure_wheelhouse(cache_dir())

    directory = state_dir(spec)
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    if not key.exists():
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"hlf-{spec.name}",
                "-f",
                str(key),
            ]
        )
    public_key = key.with_suffix(".pub").read_text().strip()
    gcs_service.metadata_key(directory)

    ensure_inotify(len(spec.vms))
    ensure_neighbours(len(spec.vms))
    try:
        _create_networks(docker_client, spec)
        containers = [_create_vm(docker_client, spec, vm, wanted, wheelhouse) for vm in spec.vms]
        for container in containers:
            container.start()
        log(f"cluster {spec.name}: {len(containers)} VMs started, configuring")
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(containers)))) as pool:
            nodes = list(
                pool.map(
                    lambda pair: _configure_vm(spec, *pair, public_key, probe),
                    zip(spec.vms, containers, strict=True),
                )
            )
        state = {
            "name": spec.name,
            "user": spec.user,
            "ssh_key": str(key),
            "known_hosts": str(directory / "known_hosts"),
            "inventory": str(spec.inventory),
            "gcp_inventory": str(spec.gcp_inventory),
            "definition": to_raw(spec),
            "network": gce_firewall.DEFAULT_NETWORK,
            "firewall": list(spec.firewall),  # the rules enforced at boot
            "nodes": nodes,
        }
        gce_firewall.enforce(state, state["firewall"])
        log(f"cluster {spec.name}: {len(spec.firewall)} firewall rules in force on every VM")
    except BaseException:
        log(f"cluster {spec.name}: bring-up failed, tearing down what was created")
        down(spec, quiet=True)
        raise

    write_known_hosts(directory, nodes)
    _check_ssh(state)
    write_state(directory, state)
    try:
        state = start_services(spec)
    except BaseException:
        log(f"cluster {spec.name}: its services failed, tearing down what was created")
        down(spec, quiet=True)
        raise
    write_inventory(spec, state)
    log(
        f"cluster {spec.name}: up in {time.monotonic() - started:.1f} s; inventory {spec.inventory}"
    )
    return state


def start_services(spec: ClusterSpec) -> dict:
    """The box's services for the cluster (kept where they run): the fake Compute Engine API,
    then Cloud Storage on loopback and the host's VPC address; every VM trusts the box's CA and
    installs Python packages from the wheelhouse. Returns the state."""
    directory = state_dir(spec)
    state = compute_service.start(directory)
    state = gcs_service.start(directory, [spec.networks["vpc"].gateway])
    ca = Path(state["gce"]["ca"]).read_text()
    nodes = state["nodes"]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(nodes)))) as pool:
        list(pool.map(lambda node: _trust_box(node["container"], ca), nodes))
    return state


# The box's CA in the VM's trust store (update-ca-certificates only when it changed), and pip
# pointed at the wheelhouse where it is mounted.
TRUST_SCRIPT = f"""
install -d /usr/local/share/ca-certificates
printf '%s\\n' "$BOX_CA_PEM" > {BOX_CA}.new
if cmp -s {BOX_CA}.new {BOX_CA} && grep -q . /etc/ssl/certs/hostnet-box.pem 2>/dev/null; then
  rm -f {BOX_CA}.new
else
  mv {BOX_CA}.new {BOX_CA}; update-ca-certificates >/dev/null 2>&1
fi
if [ -d {WHEELHOUSE} ]; then
  printf '[global]\\nno-index = true\\nfind-links = {WHEELHOUSE}\\n' > /etc/pip.conf
fi
"""


def _trust_box(container: str, ca_pem: str) -> None:
    run(
        [
            "docker",
            "exec",
            "-e",
            f"BOX_CA_PEM={ca_pem.strip()}",
            container,
            "sh",
            "-ec",
            TRUST_SCRIPT,
        ]
    )


def inotify_in_use() -> int:
    """The inotify instances open on this machine now (every process's)."""
    count = 0
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):  # a process that ended, or not ours to read
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    count += os.readlink(fd) == "anon_inode:inotify"
    return count


def ensure_inotify(new_vms: int, limit: Path = INOTIFY_LIMIT, in_use: int | None = None) -> int:
    """Raise fs.inotify.max_user_instances when `new_vms` more VMs would exceed it (the host
    default of 128 lets systemd in the ~16th VM fail); say so. Returns the limit in force."""
    in_use = inotify_in_use() if in_use is None else in_use
    needed = in_use + INOTIFY_PER_VM * new_vms + INOTIFY_SPARE
    current = int(limit.read_text())
    if current >= needed:
        return current
    try:
        limit.write_text(f"{needed}\n")
    except OSError as exc:
        raise ClusterError(
            f"{new_vms} more VMs need fs.inotify.max_user_instances of at least {needed} "
            f"({in_use} in use, {INOTIFY_PER_VM} per VM; the limit is {current}): run "
            f"`sysctl -w fs.inotify.max_user_instances={needed}` as root ({exc})"
        ) from exc
    log(
        f"raised fs.inotify.max_user_instances from {current} to {needed}: {in_use} in use and "
        f"{new_vms} VMs to start, {INOTIFY_PER_VM} each (`sysctl -w "
        f"fs.inotify.max_user_instances={current}` puts it back)"
    )
    return needed


def neighbours_in_use(stats: Path = NEIGH_STATS) -> int:
    """The entries of the kernel's ARP table now (every network namespace's); 0 where the
    kernel does not show them (a container without /proc/net/stat/arp_cache)."""
    try:
        lines = stats.read_text().splitlines()
    except FileNotFoundError:
        return 0
    return int(lines[1].split()[0], 16) if len(lines) > 1 else 0


def ensure_neighbours(new_vms: int, sysctl: Path = NEIGH_SYSCTL, in_use: int | None = None) -> int:
    """Raise the ARP table's limits (net.ipv4.neigh.default.gc_thresh2/3) when a cluster of
    `new_vms` VMs could overflow it; say so. Returns gc_thresh3 in force."""
    in_use = neighbours_in_use() if in_use is None else in_use
    needed = in_use + new_vms * (NEIGH_PER_PEER * new_vms + NEIGH_SPARE)
    hard, soft = sysctl / "gc_thresh3", sysctl / "gc_thresh2"
    current = int(hard.read_text())
    if current >= needed:
        return current
    previous_soft = int(soft.read_text())
    try:
        hard.write_text(f"{needed}\n")
        soft.write_text(f"{max(previous_soft, needed // 2)}\n")
    except OSError as exc:
        raise ClusterError(
            f"{new_vms} VMs need an ARP table of at least {needed} entries ({in_use} in use, "
            f"{NEIGH_PER_PEER} per VM and peer): run `sysctl -w "
            f"net.ipv4.neigh.default.gc_thresh3={needed}` and `sysctl -w "
            f"net.ipv4.neigh.default.gc_thresh2={needed // 2}` as root ({exc})"
        ) from exc
    log(
        f"raised net.ipv4.neigh.default.gc_thresh3 from {current} to {needed} (gc_thresh2 "
        f"{previous_soft} to {max(previous_soft, needed // 2)}): the ARP table is shared by every "
        f"VM, {new_vms} VMs reaching each other need that many entries (`sysctl -w "
        f"net.ipv4.neigh.default.gc_thresh3={current}` puts it back)"
    )
    return needed


def _create_networks(docker_client, spec: ClusterSpec) -> None:
    """The VPC and external networks (an empty project has them too), and those the VMs' NICs
    need; the others are made when a VM first needs them (ensure_networks)."""
    used = {"vpc", "external"} | {role for vm in spec.vms for role, _nic in _vm_networks(spec, vm)}
    ensure_networks(docker_client, spec, used)


def ensure_networks(docker_client, spec: ClusterSpec, roles) -> list[str]:
    """The Docker networks of these roles, made where missing (another thread making one at the
    same time is fine); returns the roles made."""
    made = []
    for role in [r for r in spec.networks if r in set(roles)]:
        network, name = spec.networks[role], spec.network_name(role)
        if docker_client.networks.list(names=[name]):
            continue
        try:
            # internal: the host reaches the VMs, nothing is routed beyond them.
            docker_client.networks.create(
                name,
                driver="bridge",
                internal=True,
                labels=_labels(spec),
                options={"com.docker.network.driver.mtu": str(network.mtu)},
                ipam=docker.types.IPAMConfig(
                    pool_configs=[
                        docker.types.IPAMPool(subnet=str(network.subnet), gateway=network.gateway)
                    ]
                ),
                check_duplicate=True,
            )
            made.append(role)
        except docker.errors.APIError as exc:
            if not docker_client.networks.list(names=[name]):
                raise ClusterError(f"cluster {spec.name}: network {name}: {exc}") from exc
    return made


def _create_vm(
    docker_client,
    spec: ClusterSpec,
    vm: VM,
    wanted: str,
    wheelhouse: Path | None = None,
    inserted: bool = False,
):
    name = spec.container(vm)
    # A new VM gets a new disk: a volume left by an interrupted `down` would bring back its
    # containers and images (a finished job the new VM has no files of).
    with contextlib.suppress(docker.errors.NotFound):
        docker_client.volumes.get(spec.volume(vm)).remove(force=True)
        log(f"cluster {spec.name}: removed the stale disk {spec.volume(vm)}")
    docker_client.volumes.create(spec.volume(vm), labels=_labels(spec))
    api = docker_client.api
    endpoints = {}
    for role, _nic in _vm_networks(spec, vm):
        aliases = [vm.name] if role == "vpc" else None
        endpoints[spec.network_name(role)] = api.create_endpoint_config(
            ipv4_address=spec.networks[role].address(vm.index), aliases=aliases
        )
    first = spec.network_name("vpc")
    container = docker_client.containers.create(
        images.PLATFORMS[vm.platform].image,
        name=name,
        hostname=vm.name,
        detach=True,
        command=["/lib/systemd/systemd"],
        environment={"container": "docker"},
        labels=_labels(
            spec,
            **{SPEC_LABEL: wanted, VM_LABEL: vm.name},
            **({INSERTED_LABEL: "true"} if inserted else {}),
        ),
        cap_add=["ALL"],
        cap_drop=CAP_DROP,
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        device_cgroup_rules=["a *:* rwm"],
        tmpfs={"/run": "rw,exec", "/run/lock": "rw", "/tmp": "rw,exec"},  # noqa: S108 (in the VM)
        volumes={
            "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
            "/lib/modules": {"bind": "/lib/modules", "mode": "ro"},
            spec.volume(vm): {"bind": "/var/lib/docker", "mode": "rw"},
            **({str(wheelhouse): {"bind": WHEELHOUSE, "mode": "ro"}} if wheelhouse else {}),
        },
        stop_signal="SIGRTMIN+3",
        network=first,
        networking_config={first: endpoints.pop(first)},
    )
    for network_name, endpoint in endpoints.items():
        api.connect_container_to_network(
            container.id, network_name, ipv4_address=endpoint["IPAMConfig"]["IPv4Address"]
        )
    return container


def _exec(container, script: str, env: dict | None = None, deadline_s: float = 120) -> str:
    result = run(
        [
            "docker",
            "exec",
            *[f"-e{k}={v}" for k, v in (env or {}).items()],
            container.name,
            "sh",
            "-ec",
            script,
        ],
        timeout=deadline_s,
    )
    return result.stdout


def _rename_script(container, spec: ClusterSpec, vm: VM) -> str:
    """Shell that gives each of the VM's interfaces its configured name (matched by MAC)."""
    container.reload()
    attached = container.attrs["NetworkSettings"]["Networks"]
    lines = []
    pairs = _vm_networks(spec, vm)
    for n, (role, _nic) in enumerate(pairs):
        mac = attached[spec.network_name(role)]["MacAddress"]
        lines.append(
            f'i=$(grep -l "^{mac}$" /sys/class/net/*/address | cut -d/ -f5); '
            f'ip link set "$i" down; ip link set "$i" name hlftmp{n}'
        )
    for n, (_role, nic) in enumerate(pairs):
        lines.append(f"ip link set hlftmp{n} name {nic}; ip link set {nic} up")
    default = ("decoy", vm.decoy) if vm.decoy else ("vpc", vm.nic)
    lines.append(
        f"ip route replace default via {spec.networks[default[0]].gateway} dev {default[1]}"
    )
    return "\n".join(lines)


METADATA_UNIT = "hlf-gce-metadata.service"
METADATA_SCRIPT = "/usr/local/lib/hlf-gce/gce_metadata.py"
# The metadata server as a unit: its address on lo (reached by the VM, its host-networked
# containers, and its bridged containers through the VM's routing) and the name in /etc/hosts,
# as GCE images have them; both set again at every start, so a restarted VM has them too.
METADATA_UNIT_TEXT = f"""[Unit]
Description=GCE metadata server (local cluster)
After=network.target

[Service]
ExecStartPre=/bin/sh -ec 'ip addr replace {gce_metadata.ADDRESS}/32 dev lo; \\
  grep -q "metadata.google.internal" /etc/hosts || \\
  echo "{gce_metadata.ADDRESS} {" ".join(gce_metadata.HOSTNAMES)}" >> /etc/hosts'
ExecStart=/usr/bin/python3 {METADATA_SCRIPT} --document {gce_metadata.DOCUMENT} \\
  --request-log /var/log/hlf-gce/requests.log --token-key {gce_metadata.KEY_FILE}
LogsDirectory=hlf-gce
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""


# A login with its authorized keys (VM_KEY, one a line) and passwordless sudo: the definition's
# user, or each user of an API-created VM's `ssh-keys` metadata, as GCE's guest agent makes them
# (VM_SUDOERS: that user's sudoers file).
USER_SCRIPT = """
id -u "$VM_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$VM_USER"
usermod -p '*' "$VM_USER"
install -d -m 0700 -o "$VM_USER" -g "$VM_USER" "/home/$VM_USER/.ssh"
printf '%s\\n' "$VM_KEY" > "/home/$VM_USER/.ssh/authorized_keys"
chown "$VM_USER:$VM_USER" "/home/$VM_USER/.ssh/authorized_keys"
chmod 0600 "/home/$VM_USER/.ssh/authorized_keys"
sudoers="${VM_SUDOERS:-/etc/sudoers.d/90-localcluster}"
printf '%s ALL=(ALL) NOPASSWD:ALL\\n' "$VM_USER" > "$sudoers"
chmod 0440 "$sudoers"
"""


def ssh_keys_users(value: str | None) -> dict[str, list[str]]:
    """The logins of an `ssh-keys` metadata value as GCE's guest agent reads it: lines
    `USER:KEY` (KEY: `TYPE BASE64 [COMMENT]`), blank and malformed lines skipped, a user's keys
    in order; a key whose google-ssh comment's expireOn has passed is skipped too."""
    users: dict[str, list[str]] = {}
    for line in (value or "").splitlines():
        user, colon, key = line.strip().partition(":")
        key = key.strip()
        if not colon or not USER_RE.match(user) or user == "root" or len(key.split()) < 2:
            continue
        if _expired(key):
            continue
        users.setdefault(user, []).append(key)
    return users


USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


def _expired(key: str) -> bool:
    """A key `... google-ssh {"userName": ..., "expireOn": "2018-12-04T20:12:00+0000"}` whose
    expiry has passed."""
    _head, marker, meta = key.partition(" google-ssh ")
    if not marker:
        return False
    try:
        expiry = json.loads(meta).get("expireOn")
        when = datetime.datetime.strptime(expiry, "%Y-%m-%dT%H:%M:%S%z")
    except (ValueError, TypeError, AttributeError):
        return False
    return when < datetime.datetime.now(datetime.UTC)


def configure_network(spec: ClusterSpec, vm: VM, container) -> None:
    """What a VM loses when its container restarts: NIC names, routes, the external path's
    filter, the hosts file (the peers' names, the metadata server's, and storage.googleapis.com
    at the host's VPC address, where the box's Cloud Storage listens). Run at creation and again
    after every start."""
    _exec(container, _rename_script(container, spec, vm))
    if vm.layout:
        _exec(container, standin_devices_script(vm))
    write_hosts(spec, vm, container)


def write_hosts(spec: ClusterSpec, vm: VM, container) -> None:
    """The VM's /etc/hosts: its peers' names at their VPC addresses (the definition's VMs and
    the API's), the metadata server's and storage.googleapis.com's."""
    # Like GCP's internal DNS: every VM's name resolves to its VPC address, on every VM.
    hosts = "".join(
        f"{spec.networks['vpc'].address(peer.index)}\t{peer.name}\n" for peer in spec.vms
    )
    # The metadata server's name too: Docker rewrites /etc/hosts when a started VM gets its new
    # external address, which can drop the line the metadata unit added at boot.
    metadata = f"{gce_metadata.ADDRESS} {' '.join(gce_metadata.HOSTNAMES)}"
    storage = f"{spec.networks['vpc'].gateway} {gcs_service.ENDPOINT.split('//')[1]}"
    # One writer at a time per VM (inserts run in parallel, each rewriting every VM's file): a
    # reader of a file another writer just truncated would keep nothing.
    _exec(
        container,
        "exec 9>/run/hlf-hosts.lock; flock 9; "
        'kept=$(grep -v "\\s$VM_NAME$" /etc/hosts | grep -v "storage.googleapis.com" || true); '
        'printf "%s\\n%s" "$kept" "$HOSTS" > /etc/hosts; '
        'grep -q "metadata.google.internal" /etc/hosts || echo "$METADATA" >> /etc/hosts; '
        'echo "$STORAGE" >> /etc/hosts',
        env={"VM_NAME": vm.name, "HOSTS": hosts, "METADATA": metadata, "STORAGE": storage},
    )


def wait_booted(vm: VM, container) -> None:
    """systemd, sshd and the VM's dockerd are up."""
    wait_until(
        f"{vm.name}: systemd, sshd and dockerd",
        lambda: (
            run(
                ["docker", "exec", container.name, "systemctl", "is-active", "ssh", "docker"],
                check=False,
            ).returncode
            == 0
        ),
        deadline_s=BOOT_DEADLINE_S,
    )
    wait_until(
        f"{vm.name}: dockerd",
        lambda: (
            run(["docker", "exec", container.name, "docker", "info"], check=False).returncode == 0
        ),
        deadline_s=BOOT_DEADLINE_S,
    )


def _configure_vm(
    spec: ClusterSpec,
    vm: VM,
    container,
    public_key: str | None,
    probe: str,
    instance: dict | None = None,
) -> dict:
    """Set a started VM up; its state node. `instance`: what an API-created VM's insert asked
    for beyond the definition's fields (gce_control.instance_extras: metadata items, scheduling,
    service accounts...): its logins are its `ssh-keys` metadata's (none for `public_key`), its
    metadata server serves them; the node keeps it."""
    configure_network(spec, vm, container)
    if public_key is not None:
        _exec(container, USER_SCRIPT, env={"VM_USER": spec.user, "VM_KEY": public_key})
    attributes = (instance or {}).get("attributes") or {}
    for user, keys in ssh_keys_users(attributes.get("ssh-keys")).items():
        _exec(
            container,
            USER_SCRIPT,
            env={
                "VM_USER": user,
                "VM_KEY": "\n".join(keys),
                "VM_SUDOERS": f"/etc/sudoers.d/91-google-{user.replace('.', '_')}",
            },
        )
    wait_booted(vm, container)
    container.reload()
    attached = container.attrs["NetworkSettings"]["Networks"]
    vpc_mac = attached[spec.network_name("vpc")]["MacAddress"]
    macs_by_role = {
        role: attached[spec.network_name(role)]["MacAddress"]
        for role, _nic in _vm_networks(spec, vm)
    }
    control_nics, gpu_nics = nic_entries(spec, vm, macs_by_role)
    macs = _macs([*control_nics, *gpu_nics])
    instance_id = _start_metadata_server(spec, vm, container, vpc_mac, macs, instance)
    pipe(
        ["docker", "save", probe],
        ["docker", "exec", "-i", container.name, "docker", "load", "-q"],
        what=f"{vm.name}: loading {probe} into its dockerd",
        timeout=300,
    )
    host_key = wait_until(
        f"{vm.name}: SSH host key",
        lambda: _exec(container, "cat /etc/ssh/ssh_host_ed25519_key.pub").strip(),
        deadline_s=BOOT_DEADLINE_S,
    )
    host_key = " ".join(host_key.split()[:2])
    return {
        "name": vm.name,
        "container": container.name,
        "index": vm.index,
        "platform": vm.platform,
        "nic": vm.nic,
        "second_nic": vm.second_nic,
        "decoy": vm.decoy,
        "tags": list(vm.tags),
        "external_nic": EXTERNAL_NIC,
        "vpc_address": spec.networks["vpc"].address(vm.index),
        "vpc_prefix": spec.networks["vpc"].subnet.prefixlen,
        "vpc_mtu": spec.networks["vpc"].mtu,
        "external_address": spec.networks["external"].address(vm.index),
        "second_address": (spec.networks["secondary"].address(vm.index) if vm.second_nic else None),
        "decoy_address": spec.networks["decoy"].address(vm.index) if vm.decoy else None,
        "vpc_mac": vpc_mac,
        "project": spec.project,
        "zone": vm.zone,
        "machine_type": vm.machine_type,
        # A GPU machine type's NICs ([] otherwise), GCP's order, each {name, address, network
        # (its role), gce_network (its GCE name), mtu, mac, pci_slot (None: GCP publishes
        # none)}; control_nics[0] is `nic`, on the vpc network.
        "control_nics": control_nics,
        "gpu_nics": gpu_nics,
        "instance_id": instance_id,
        "host_key": host_key,
        **({"instance": instance} if instance is not None else {}),
    }


def nic_entries(
    spec: ClusterSpec, vm: VM, macs: dict[str, str] | None = None
) -> tuple[list[dict], list[dict]]:
    """(control_nics, gpu_nics) of a VM's state node: its GPU machine type's NICs ([] for
    another type), `macs` their MACs by network role (Docker's address-derived MAC else)."""
    entries = {"control": [], "gpu": []}
    for nic in machine_nics(vm):
        address = spec.networks[nic.role].address(vm.index)
        entries[nic.kind].append(
            {
                "name": nic.name,
                "address": address,
                "network": nic.role,
                "gce_network": spec.gce_network(nic.role),
                "mtu": spec.networks[nic.role].mtu,
                "mac": (macs or {}).get(nic.role) or docker_mac(address),
                "pci_slot": nic.pci_slot,
            }
        )
    return entries["control"], entries["gpu"]


def _macs(nics) -> dict[str, str]:
    return {nic["name"]: nic["mac"] for nic in nics}


def node_macs(node: dict) -> dict[str, str]:
    """NIC name -> MAC of a state node's GPU machine-type NICs (for metadata_document)."""
    return _macs([*node.get("control_nics", []), *node.get("gpu_nics", [])])


def docker_mac(address: str) -> str:
    """The MAC Docker (before 26) gives an endpoint: 02:42 and the IPv4 address's bytes."""
    return "02:42:" + ":".join(f"{int(octet):02x}" for octet in address.split("."))


def metadata_document(
    spec: ClusterSpec,
    vm: VM,
    vpc_mac: str,
    external_ip: str | None = None,
    macs: dict[str, str] | None = None,
    instance: dict | None = None,
    preempted: bool = False,
) -> dict:
    """What the VM's metadata server answers: its name, zone, project, machine type, nic0 (the
    VPC NIC) with the external address as its access config; for a GPU machine type its other
    NICs after nic0 in GCP's order (the second control NIC, then the GPU NICs), `macs` giving
    their MACs by NIC name (Docker's address-derived MAC where it does not). `instance`: an
    API-created VM's insert (its node's "instance": attributes, scheduling, service accounts,
    tags); `preempted`: instance/preempted TRUE (GCE's notice before it stops a spot VM)."""
    vpc = spec.networks["vpc"]
    more = []
    for nic in machine_nics(vm)[1:]:
        network = spec.networks[nic.role]
        address = network.address(vm.index)
        more.append(
            {
                "ip": address,
                "mac": (macs or {}).get(nic.name) or docker_mac(address),
                "mtu": network.mtu,
                "network": spec.gce_network(nic.role),
                "prefix": network.subnet.prefixlen,
                "gateway": network.gateway,
            }
        )
    instance = instance or {}
    return gce_metadata.vm_document(
        project=spec.project,
        zone=vm.zone,
        name=vm.name,
        instance_id=gce_metadata.numeric_id(f"{spec.project}/{spec.name}/{vm.name}", digits=19),
        machine_type=vm.machine_type,
        ip=vpc.address(vm.index),
        mac=vpc_mac,
        prefix=vpc.subnet.prefixlen,
        gateway=vpc.gateway,
        mtu=vpc.mtu,
        external_ip=external_ip or spec.networks["external"].address(vm.index),
        more_nics=more or None,
        tags=list(vm.tags),
        attributes=instance.get("attributes"),
        scheduling=instance.get("scheduling"),
        service_accounts=instance.get("serviceAccounts"),
        preempted=preempted,
    )


def node_document(
    spec: ClusterSpec, node: dict, external_ip: str | None = None, preempted: bool = False
) -> dict:
    """metadata_document of a state node (its VM, MACs, external address, insert's extras)."""
    return metadata_document(
        spec,
        spec.vm(node["name"]),
        node["vpc_mac"],
        external_ip=external_ip or node["external_address"],
        macs=node_macs(node),
        instance=node.get("instance"),
        preempted=preempted,
    )


def renew_external_address(spec: ClusterSpec, vm: VM, container, directory: Path) -> str:
    """As Compute Engine releases a stopped VM's ephemeral external IP and gives it a new one at
    start: the running container leaves the external network and joins it again at a free
    address (from the top of the subnet down); state.json, known_hosts, the static inventory and
    the VM's metadata follow. Returns the new address."""
    path = directory / "state.json"
    with state_lock(directory):
        state = json.loads(path.read_text())
        node = next(n for n in state["nodes"] if n["name"] == vm.name)
        network = spec.networks["external"]
        used = {n["external_address"] for n in state["nodes"]} | {network.gateway}
        used |= {network.address(peer.index) for peer in spec.vms}
        used |= {network.address(index) for index in (state.get("pending") or {}).values()}
        address = next(str(a) for a in reversed(list(network.subnet.hosts())) if str(a) not in used)
        external = client().networks.get(spec.network_name("external"))
        external.disconnect(container, force=True)
        external.connect(container, ipv4_address=address)
        node["external_address"] = address
        write_state(directory, state)
        write_known_hosts(directory, state["nodes"])
        write_inventory(spec, state)
    gce_metadata.publish(container.name, node_document(spec, node, external_ip=address))
    return address


def _put(container, path: str, text: str) -> None:
    """Write `text` to `path` in the VM, its folder made if needed."""
    run(
        [
            "docker",
            "exec",
            "-i",
            container.name,
            "sh",
            "-ec",
            'install -d "${0%/*}" && cat > "$0"',
            path,
        ],
        input_text=text,
    )


def _start_metadata_server(
    spec: ClusterSpec,
    vm: VM,
    container,
    vpc_mac: str,
    macs: dict[str, str],
    instance: dict | None = None,
) -> int:
    """Install the metadata server and its document into the VM, start it; the VM's id."""
    document = metadata_document(spec, vm, vpc_mac, macs=macs, instance=instance)
    gce_metadata.publish(container.name, document)
    _put(container, METADATA_SCRIPT, Path(gce_metadata.__file__).read_text())
    # The key its tokens are signed with, which the box's Cloud Storage checks them by.
    key = gcs_service.metadata_key(state_dir(spec)).read_text()
    _put(container, gce_metadata.KEY_FILE, key)
    _exec(container, f"chmod 0600 {gce_metadata.KEY_FILE}")
    _put(container, f"/etc/systemd/system/{METADATA_UNIT}", METADATA_UNIT_TEXT)
    _exec(container, f"systemctl daemon-reload; systemctl enable --now {METADATA_UNIT}")
    url = f"http://{gce_metadata.HOSTNAMES[0]}/computeMetadata/v1/instance/id"
    wait_until(
        f"{vm.name}: its metadata server",
        lambda: _exec(container, f"curl -sf -H 'Metadata-Flavor: Google' {url}").strip(),
        deadline_s=BOOT_DEADLINE_S,
        interval=0.2,
    )
    return document["instance"]["id"]


def _check_ssh(state: dict) -> None:
    """Every VM's sshd answers on its external address, with the recorded host key."""
    for node in state["nodes"]:
        address = node["external_address"]

        def banner(address=address) -> bool:
            with socket.create_connection((address, 22), timeout=3) as sock:
                return sock.recv(64).startswith(b"SSH-")

        wait_until(f"{node['name']}: sshd on {address}", banner, deadline_s=BOOT_DEADLINE_S)
        run(ssh_command(state, address, "true"), timeout=60)


def ssh_command(state: dict, address: str, *command: str) -> list[str]:
    """ssh to a VM as the controller does: the cluster's key and login, its known_hosts checked
    strictly, no password prompt."""
    return [
        "ssh",
        "-i",
        state["ssh_key"],
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={state['known_hosts']}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "ConnectTimeout=10",
        f"{state['user']}@{address}",
        *command,
    ]


def write_known_hosts(directory: Path, nodes: list[dict]) -> None:
    """Each VM's host key under its external address (the address ssh is given)."""
    path = directory / "known_hosts"
    tmp = path.with_name(f".known_hosts.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text("".join(f"{n['external_address']} {n['host_key']}\n" for n in nodes))
    tmp.replace(path)


def write_inventory(spec: ClusterSpec, state: dict) -> Path:
    ssh_args = (
        f"-o UserKnownHostsFile={state['known_hosts']} -o StrictHostKeyChecking=yes "
        "-o IdentitiesOnly=yes"
    )
    hosts = {}
    for node in state["nodes"]:
        # An API-created VM's rank is its label's (the collection's GCP path reads it so too).
        rank = (node.get("instance") or {}).get("labels", {}).get("llamafactory-rank", "")
        hosts[node["name"]] = {
            "ansible_host": node["external_address"],
            "llamafactory_node_rank": int(rank) if rank.isdigit() else node["index"],
        }
    inventory = {
        "all": {
            "children": {
                "llamafactory": {
                    "hosts": hosts,
                    "vars": {
                        "ansible_user": state["user"],
                        "ansible_ssh_private_key_file": state["ssh_key"],
                        "ansible_ssh_common_args": ssh_args,
                        "ansible_python_interpreter": "/usr/bin/python3",
                        "llamafactory_platform": "local",
                    },
                }
            }
        }
    }
    header = [
        f"# Written by `localcluster up` for the local cluster {spec.name!r}; removed by",
        "# `localcluster down`. ansible_host is each VM's external address (SSH only);",
        "# the VPC addresses the nodes train over:",
    ]
    header += [
        f"#   {n['name']}: {n['vpc_address']}/{n['vpc_prefix']} on {n['nic']}"
        for n in state["nodes"]
    ]
    spec.inventory.parent.mkdir(parents=True, exist_ok=True)
    spec.inventory.write_text(
        "\n".join(header) + "\n---\n" + yaml.safe_dump(inventory, sort_keys=False)
    )
    if "gce" in state:
        write_gcp_inventory(spec, state, inventory["all"]["children"]["llamafactory"]["vars"])
    return spec.inventory


SHIPPED_GCP_INVENTORY = repo_root() / "inventories" / "gcp_compute.yml"


def gcp_compute_config(gce: dict) -> dict:
    """The shipped inventories/gcp_compute.yml with what only the box supplies: its project and
    zone, and the service-account key its token endpoint accepts."""
    config = yaml.safe_load(SHIPPED_GCP_INVENTORY.read_text())
    config.update(
        projects=[gce["project"]],
        zones=[gce["zone"]],
        auth_kind="serviceaccount",
        service_account_file=gce["service_account_file"],
    )
    return config


def api_environment(spec: ClusterSpec) -> dict[str, str]:
    """The environment a GCP client on the controller needs to reach the running cluster's
    Compute Engine API: its proxy (HTTPS_PROXY) and CA (REQUESTS_CA_BUNDLE)."""
    path = state_dir(spec) / "state.json"
    gce = json.loads(path.read_text()).get("gce") if path.exists() else None
    if not gce:
        raise ClusterError(f"cluster {spec.name} is not up: run `./dev cluster up` first")
    return dict(gce["env"])


def write_gcp_inventory(spec: ClusterSpec, state: dict, login: dict) -> Path:
    """The GCP path's inventory, a folder (ansible-playbook -i FOLDER): gcp_compute.yml (the
    dynamic inventory, see gcp_compute_config), box.yml (the SSH login and the firewall role's
    credentials, for the group) and group_vars (the job's settings, shared with the static
    inventory). Ansible reaches the box's API with state["gce"]["env"] (`localcluster env`)."""
    folder = spec.gcp_inventory
    folder.mkdir(parents=True, exist_ok=True)
    gce = state["gce"]
    header = (
        f"# Written by `localcluster up` for the local cluster {spec.name!r}: the shipped\n"
        "# inventories/gcp_compute.yml, only its project, zones (every zone of the box's\n"
        "# project, where the collection may create VMs) and credentials the box's.\n"
        '# Needs the box\'s proxy and CA in the environment: eval "$(./dev cluster env)".\n'
    )
    (folder / "gcp_compute.yml").write_text(
        header
        + yaml.safe_dump(
            {**gcp_compute_config(gce), "zones": list(spec.zones or [gce["zone"]])},
            sort_keys=False,
        )
    )
    box = {key: value for key, value in login.items() if key != "llamafactory_platform"}
    box.update(
        llamafactory_gcp_auth_kind="serviceaccount",
        llamafactory_gcp_service_account_file=gce["service_account_file"],
    )
    # What the controller's own plays read (playbooks/up.yml creates VMs before the group has
    # any): the credentials, and where and how role gcp_vms makes VMs in this project.
    controller = {
        "llamafactory_gcp_auth_kind": "serviceaccount",
        "llamafactory_gcp_service_account_file": gce["service_account_file"],
        "gcp_vms_project": gce["project"],
        "gcp_vms_zones": list(spec.zones or [gce["zone"]]),
        "gcp_vms_machine_type": "n2-standard-4",
        "gcp_vms_ssh_user": spec.user,
        "gcp_vms_ssh_public_key_file": str(state_dir(spec) / "id_ed25519.pub"),
    }
    (folder / "box.yml").write_text(
        f"# The local cluster {spec.name!r}'s SSH login, GCP credentials and VM settings.\n---\n"
        + yaml.safe_dump(
            {"all": {"vars": controller}, "llamafactory": {"vars": box}}, sort_keys=False
        )
    )
    link = folder / "group_vars"
    if not link.is_symlink():
        link.symlink_to(Path("..") / "group_vars")
    # No host variables: the box's one difference from GCP is llamafactory_local_cluster in the
    # shared group_vars. A host_vars folder an older box wrote here would still be loaded.
    shutil.rmtree(folder / "host_vars", ignore_errors=True)
    return folder


# ---------------------------------------------------------------- down / status


def leftovers(docker_client, name: str) -> list[str]:
    """Everything of cluster `name` that still exists in Docker (containers, networks, volumes)."""
    label = {"label": f"{CLUSTER_LABEL}={name}"}
    found = [f"container {c.name}" for c in docker_client.containers.list(all=True, filters=label)]
    found += [f"network {n.name}" for n in docker_client.networks.list(filters=label)]
    found += [f"volume {v.name}" for v in docker_client.volumes.list(filters=label)]
    return found


def down(spec: ClusterSpec, quiet: bool = False) -> None:
    docker_client = client()
    gcs_service.stop(state_dir(spec))
    compute_service.stop(state_dir(spec))
    label = {"label": f"{CLUSTER_LABEL}={spec.name}"}
    for container in docker_client.containers.list(all=True, filters=label):
        container.remove(force=True, v=True)
        quiet or log(f"removed container {container.name}")
    for network in docker_client.networks.list(filters=label):
        network.remove()
        quiet or log(f"removed network {network.name}")
    for volume in docker_client.volumes.list(filters=label):
        volume.remove(force=True)
        quiet or log(f"removed volume {volume.name}")
    shutil.rmtree(state_dir(spec), ignore_errors=True)
    if spec.inventory.exists():
        spec.inventory.unlink()
    shutil.rmtree(spec.gcp_inventory, ignore_errors=True)
    left = leftovers(docker_client, spec.name)
    if left:
        raise ClusterError(f"cluster {spec.name}: could not remove {', '.join(left)}")
    quiet or log(f"cluster {spec.name}: down, nothing left but the cached images")


def status(spec: ClusterSpec) -> list[dict]:
    docker_client = client()
    rows = []
    for container in docker_client.containers.list(
        all=True, filters={"label": f"{CLUSTER_LABEL}={spec.name}"}
    ):
        networks = container.attrs["NetworkSettings"]["Networks"]
        rows.append(
            {
                "container": container.name,
                "status": container.status,
                "addresses": {name: net["IPAddress"] for name, net in networks.items()},
            }
        )
    return rows
