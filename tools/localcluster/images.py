"""Images of the local cluster: the "VM" image per platform and a tiny probe image; and the
VMs' wheelhouse (ensure_wheelhouse), the Python packages they install offline.

A VM image is pulled and built from a registry's base image when a registry answers, else
bootstrapped with debootstrap from the distribution's archive and imported. Images are cached:
each carries a label with a hash of its build inputs and is rebuilt only when those change.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .util import ClusterError, log, pipe, run, stream

IMAGE_LABEL = "hostnet.llamafactory.image"
INPUTS_LABEL = "hostnet.llamafactory.image.inputs"
HERE = Path(__file__).resolve().parent
CUSTOMIZE = HERE / "image" / "customize.sh"
DOCKERFILE = HERE / "image" / "Dockerfile"
PROBE_IMAGE = "hostnet-llamafactory/probe:busybox"
BUILD_DEADLINE_S = 1200

VM_PACKAGES = (
    "python3",
    "python3-apt",
    "sudo",
    "systemd",
    "systemd-sysv",
    "dbus",
    "iproute2",
    "iputils-ping",
    "openssh-server",
    "ca-certificates",
    "procps",
    "curl",
    "gnupg",
    "docker.io",
    "iptables",
    "kmod",
    "python3-requests",
    "python3-venv",  # a node makes venvs (python3 -m venv) for its Python tools
)
# A "blank" host (no Docker) for role tests that install it.
ENGINE_PACKAGES = ("docker.io", "iptables", "kmod", "python3-requests")
BLANK_PACKAGES = tuple(p for p in VM_PACKAGES if p not in ENGINE_PACKAGES)
# A blank host that is an Ansible controller for the nox matrix: venvs, git and shellcheck
# (ansible-test sanity).
CONTROLLER_PACKAGES = (*BLANK_PACKAGES, "git", "shellcheck")
KINDS = {"vm": VM_PACKAGES, "blank": BLANK_PACKAGES, "controller": CONTROLLER_PACKAGES}


@dataclass(frozen=True)
class Platform:
    """A distribution release the cluster can run as its VMs' OS."""

    name: str
    suite: str
    mirror: str
    base_image: str
    components: str = "main"
    # Archive keyring for debootstrap on a host whose distribution lacks it: (URL of the .deb,
    # path of the keyring inside it, fingerprint that must sign the archive).
    keyring_deb: tuple[str, str, str] | None = None

    @property
    def image(self) -> str:
        return self.image_of("vm")

    def image_of(self, kind: str) -> str:
        return f"hostnet-llamafactory/{kind}:{self.name}"


PLATFORMS = {
    "debian12": Platform("debian12", "bookworm", "http://deb.debian.org/debian", "debian:bookworm"),
    # Python 3.13: the controller matrix (noxfile.py) runs ansible-core 2.20+ on it.
    "debian13": Platform("debian13", "trixie", "http://deb.debian.org/debian", "debian:trixie"),
    "ubuntu2204": Platform(
        "ubuntu2204",
        "jammy",
        "http://archive.ubuntu.com/ubuntu",
        "ubuntu:22.04",
        components="main,universe",
        keyring_deb=(
            "http://archive.ubuntu.com/ubuntu/pool/main/u/ubuntu-keyring/"
            "ubuntu-keyring_2021.03.26_all.deb",
            "usr/share/keyrings/ubuntu-archive-keyring.gpg",
            # Ubuntu Archive Automatic Signing Key (2018) <ftpmaster@ubuntu.com>
            "F6ECB3762474EDA9D21B7022871920D1991BC93C",
        ),
    ),
}


class ArchiveUnreachable(ClusterError):
    """The platform's package archive did not answer: callers may skip that platform."""


def inputs_hash(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def vm_inputs(platform: Platform, kind: str = "vm") -> str:
    return inputs_hash(
        f"{kind}/1",
        platform.name,
        platform.suite,
        " ".join(KINDS[kind]),
        CUSTOMIZE.read_bytes(),
        DOCKERFILE.read_bytes(),
    )


def image_inputs(client, name: str) -> str | None:
    """The inputs hash recorded on a local image, or None when the image is absent."""
    import docker.errors

    try:
        image = client.images.get(name)
    except docker.errors.ImageNotFound:
        return None
    return (image.labels or {}).get(INPUTS_LABEL, "")


def archive_answers(url: str, timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http mirror)
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def ensure_vm_image(client, platform: Platform, cache_dir: Path, kind: str = "vm") -> str:
    """The platform's image of `kind` ("vm": with Docker; "blank": without), built if needed."""
    image = platform.image_of(kind)
    wanted = vm_inputs(platform, kind)
    if image_inputs(client, image) == wanted:
        log(f"image {image}: cached")
        return image
    log(f"image {image}: building (inputs {wanted})")
    started = time.monotonic()
    if not _build_from_registry(platform, kind, wanted):
        _build_with_debootstrap(platform, kind, wanted, cache_dir)
    log(f"image {image}: built in {time.monotonic() - started:.0f} s")
    return image


def _labels(kind: str, inputs: str) -> list[str]:
    return [f"{IMAGE_LABEL}={kind}", f"{INPUTS_LABEL}={inputs}"]


def _build_from_registry(platform: Platform, kind: str, inputs: str) -> bool:
    """docker pull + docker build; False when no registry answers."""
    pulled = subprocess.run(
        ["docker", "pull", "-q", platform.base_image],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if pulled.returncode != 0:
        reason = (pulled.stderr.strip().splitlines() or ["no output"])[-1]
        log(f"  no registry for {platform.base_image} ({reason[:120]}); using debootstrap")
        return False
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(CUSTOMIZE, context)
        shutil.copy(DOCKERFILE, context)
        command = [
            "docker",
            "build",
            "--pull=false",
            "-t",
            platform.image_of(kind),
            "--build-arg",
            f"BASE={platform.base_image}",
            "--build-arg",
            "PACKAGES=" + " ".join(KINDS[kind]),
        ]
        for label in _labels(kind, inputs):
            command += ["--label", label]
        stream([*command, context], prefix="  build: ", deadline_s=BUILD_DEADLINE_S)
    return True


def _keyring_for(platform: Platform, workdir: Path) -> list[str]:
    """debootstrap's --keyring argument, fetching and checking the archive key if needed."""
    if platform.keyring_deb is None:
        return []
    url, member, fingerprint = platform.keyring_deb
    deb = workdir / "keyring.deb"
    log(f"  fetching the archive keyring {url}")
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (signed below)
            deb.write_bytes(response.read())
    except (urllib.error.URLError, OSError) as exc:
        raise ArchiveUnreachable(f"{platform.name}: cannot fetch {url}: {exc}") from exc
    run(["dpkg-deb", "-x", str(deb), str(workdir / "keyring")])
    keyring = workdir / "keyring" / member
    listing = run(
        [
            "gpg",
            "--batch",
            "--no-default-keyring",
            "--keyring",
            str(keyring),
            "--with-colons",
            "--list-keys",
        ]
    ).stdout
    fingerprints = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    if fingerprint not in fingerprints:
        raise ClusterError(
            f"{platform.name}: {url} does not hold the key {fingerprint} "
            f"(found {', '.join(fingerprints) or 'none'}); refusing to use it"
        )
    return [f"--keyring={keyring}"]


def _build_with_debootstrap(platform: Platform, kind: str, inputs: str, cache_dir: Path) -> None:
    for tool in ("debootstrap", "tar"):
        if not shutil.which(tool):
            raise ClusterError(
                f"{tool} is missing: install it (apt-get install {tool}) or use a "
                "machine whose Docker reaches a registry"
            )
    release = f"{platform.mirror}/dists/{platform.suite}/Release"
    if not archive_answers(release):
        raise ArchiveUnreachable(f"{platform.name}: the archive does not answer ({release})")
    build_root = cache_dir / "build"
    build_root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{platform.name}-", dir=build_root))
    rootfs = workdir / "rootfs"
    try:
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--components={platform.components}",
            "--include=" + ",".join(KINDS[kind]),
            *_keyring_for(platform, workdir),
            platform.suite,
            str(rootfs),
            platform.mirror,
        ]
        stream(command, prefix="  debootstrap: ", deadline_s=BUILD_DEADLINE_S, every=25)
        shutil.copy(CUSTOMIZE, rootfs / "customize.sh")
        run(["chroot", str(rootfs), "sh", "/customize.sh"])
        (rootfs / "customize.sh").unlink()
        _import(
            rootfs,
            platform.image_of(kind),
            kind,
            inputs,
            command='["/lib/systemd/systemd"]',
            extra=["ENV container=docker"],
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _import(
    rootfs: Path, name: str, kind: str, inputs: str, command: str, extra: list[str]
) -> None:
    changes = [f"CMD {command}", *extra, "LABEL " + " ".join(_labels(kind, inputs))]
    args = ["docker", "import"]
    for change in changes:
        args += ["--change", change]
    log(f"  importing {name}")
    pipe(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
        [*args, "-", name],
        what=f"docker import of {name}",
    )


# What the VMs' pip installs from the wheelhouse (a node's venv: Google's Cloud Storage client),
# for their Python: Debian 12's 3.11 on x86_64 (glibc 2.36).
WHEELHOUSE_REQUIREMENTS = ("google-cloud-storage>=3.0,<4",)
WHEEL_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
WHEEL_PYTHON = ("3.11", "cp", ("cp311", "abi3", "none"))


def ensure_wheelhouse(cache_dir: Path) -> Path:
    """A folder of wheels (WHEELHOUSE_REQUIREMENTS and their dependencies, for the VMs' Python),
    downloaded once with this machine's pip into cache_dir/vm-wheelhouse/<inputs>; the VMs here
    cannot reach PyPI (test-machine.md), so their pip installs from it offline."""
    version, implementation, abis = WHEEL_PYTHON
    inputs = inputs_hash("wheelhouse/1", *WHEELHOUSE_REQUIREMENTS, *WHEEL_PLATFORMS, version, *abis)
    folder = cache_dir / "vm-wheelhouse" / inputs  # (wheelhouse/ is the training image's)
    if (folder / ".complete").exists():
        return folder
    log(f"wheelhouse {folder}: downloading {', '.join(WHEELHOUSE_REQUIREMENTS)} (once)")
    partial = folder.with_name(f"{inputs}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(partial)]
    command += ["--only-binary=:all:", "--python-version", version]
    command += ["--implementation", implementation]
    command += [f"--platform={platform}" for platform in WHEEL_PLATFORMS]
    command += [f"--abi={abi}" for abi in abis]
    try:
        run([*command, *WHEELHOUSE_REQUIREMENTS], timeout=600)
    except ClusterError as exc:
        message = f"the VMs' wheelhouse: pip download failed (PyPI reachable?): {exc}"
        raise ClusterError(message) from exc
    (partial / ".complete").write_text("\n".join(WHEELHOUSE_REQUIREMENTS) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def ensure_probe_image(client, cache_dir: Path) -> str:
    """A few-MB busybox image that the VMs' own dockerd runs (from the host's busybox-static)."""
    busybox = shutil.which("busybox")
    if not busybox:
        raise ClusterError("busybox is missing on this machine: apt-get install busybox-static")
    binary = Path(busybox).read_bytes()
    wanted = inputs_hash("probe/1", binary)
    if image_inputs(client, PROBE_IMAGE) == wanted:
        return PROBE_IMAGE
    if b"/ld-linux" in binary:  # a dynamic binary names its loader; the image has none
        raise ClusterError(f"{busybox} is not statically linked: apt-get install busybox-static")
    (cache_dir / "build").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir / "build") as workdir:
        rootfs = Path(workdir)
        (rootfs / "bin").mkdir()
        (rootfs / "tmp").mkdir(mode=0o1777)
        shutil.copy(busybox, rootfs / "bin" / "busybox")
        applets = run([busybox, "--list"]).stdout.split()
        for applet in applets:
            if applet != "busybox":
                (rootfs / "bin" / applet).symlink_to("busybox")
        _import(rootfs, PROBE_IMAGE, "probe", wanted, command='["/bin/sh"]', extra=[])
    log(f"image {PROBE_IMAGE}: built")
    return PROBE_IMAGE


def list_images(client) -> list[tuple[str, str, int]]:
    """(tag, kind, size in bytes) of every image this tool made."""
    rows = []
    for image in client.images.list(filters={"label": IMAGE_LABEL}):
        kind = image.labels.get(IMAGE_LABEL, "")
        for tag in image.tags or [image.short_id]:
            rows.append((tag, kind, image.attrs.get("Size", 0)))
    return sorted(rows)


def remove_images(client) -> None:
    for tag, _kind, _size in list_images(client):
        client.images.remove(tag, force=False)
        log(f"removed image {tag}")
    for volume in client.volumes.list(filters={"label": IMAGE_LABEL}):
        volume.remove()  # the registries' storage (fails while a cluster's registry uses it)
        log(f"removed volume {volume.name}")
