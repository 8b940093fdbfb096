"""Stand-ins for Google's GPU networking images, under their real names, for the local cluster.

GCP's GPU VMs get Google's NCCL network plugins from installer images and, for GPUDirect-TCPXO,
run a receive-datapath manager (RxDM) container. The local cluster has no GPU and cannot reach
Artifact Registry, so it builds small images from the Debian "blank" image that follow the real
ones' command lines, file layout and log lines (gpu_standins/<folder>/, see its README.md) and
install no working library. Each image carries the label `hostnet.llamafactory.standin=true`,
and each of its scripts says "stand-in for the local cluster; not Google's".

Images are cached like the other images of the cluster: a label with the hash of their inputs
(the scripts, and the blank image's own inputs); `localcluster rmi` removes them too.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from . import images
from .util import ClusterError, log, pipe, run

HERE = Path(__file__).resolve().parent / "gpu_standins"
STANDIN_LABEL = "hostnet.llamafactory.standin"
KIND = "gpu-standin"

IMAGES = {
    "tcpxo_installer": "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/"
    "nccl-plugin-gpudirecttcpx-dev:v1.0.17",
    "rxdm": "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.23",
    "gib_installer": "us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1",
}
# Per image: the folder of gpu_standins/ it carries, where the image has it, and its entrypoint.
LAYOUT = {
    "tcpxo_installer": ("tcpxo_installer", "/scripts", "/scripts/container_entry.sh"),
    "rxdm": ("rxdm", "/fts", "/fts/entrypoint_rxdm_container.sh"),
    "gib_installer": ("gib_installer", "/scripts", "/scripts/container_entry.sh"),
}
PROFILES = {
    "tcpxo": ["tcpxo_installer", "rxdm"],
    "gib": ["gib_installer"],
    "socket": [],
}
BLANK = images.PLATFORMS["debian12"]


def wanted(profile: str) -> list[str]:
    """The stand-in image names a VM of a network profile (socket, tcpxo, gib) needs."""
    if profile not in PROFILES:
        raise ValueError(f"network profile {profile!r} is not one of {', '.join(PROFILES)}")
    return [IMAGES[key] for key in PROFILES[profile]]


def _dockerfile(base: str, key: str) -> str:
    _folder, target, entrypoint = LAYOUT[key]
    return f'FROM {base}\nCOPY files/ {target}/\nENTRYPOINT ["{entrypoint}"]\nCMD []\n'


def _files(key: str) -> list[Path]:
    folder = HERE / LAYOUT[key][0]
    return sorted(path for path in folder.iterdir() if path.is_file())


def _inputs(key: str, base: str) -> str:
    parts: list[str | bytes] = ["gpu-standin/1", IMAGES[key], _dockerfile(base, key)]
    for path in _files(key):
        parts += [path.name, path.read_bytes()]
    parts.append(images.vm_inputs(BLANK, "blank"))
    return images.inputs_hash(*parts)


def _build(key: str, base: str, inputs: str, cache_dir: Path) -> None:
    name = IMAGES[key]
    (cache_dir / "build").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-standin-", dir=cache_dir / "build") as context:
        files = Path(context) / "files"
        files.mkdir()
        for path in _files(key):
            shutil.copy(path, files / path.name)
            (files / path.name).chmod(0o755 if path.suffix == ".sh" else 0o644)
        (Path(context) / "Dockerfile").write_text(_dockerfile(base, key))
        command = ["docker", "build", "--pull=false", "-q", "-t", name]
        for label in [*images._labels(KIND, inputs), f"{STANDIN_LABEL}=true"]:
            command += ["--label", label]
        run([*command, context], timeout=300)


def ensure_images(client, cache_dir: Path) -> list[str]:
    """Build the three stand-in images when missing or stale (from the Debian blank image, itself
    built if needed); returns their names (the values of IMAGES)."""
    base = images.ensure_vm_image(client, BLANK, cache_dir, kind="blank")
    for key, name in IMAGES.items():
        inputs = _inputs(key, base)
        if images.image_inputs(client, name) == inputs:
            continue
        started = time.monotonic()
        _build(key, base, inputs, cache_dir)
        log(f"image {name}: built in {time.monotonic() - started:.1f} s (stand-in, not Google's)")
    return list(IMAGES.values())


def _image_id(docker: list[str], name: str) -> str:
    """The image ID of `name` in the dockerd that `docker` reaches ("" when it has none)."""
    return subprocess.run(
        [*docker, "image", "inspect", "-f", "{{.Id}}", name],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.strip()


def load_into(vm_container: str, names: list[str], timeout: float = 300) -> None:
    """docker save here | docker load in a VM's own dockerd, for the images the VM lacks (or has
    with another image ID); all missing ones in one stream, so shared layers travel once."""
    missing = []
    for name in names:
        want = _image_id(["docker"], name)
        if not want:
            raise ClusterError(f"{name} is not on this machine: build it with ensure_images")
        if _image_id(["docker", "exec", vm_container, "docker"], name) != want:
            missing.append(name)
    if not missing:
        return
    log(f"{vm_container}: loading {', '.join(missing)}")
    pipe(
        ["docker", "save", *missing],
        ["docker", "exec", "-i", vm_container, "docker", "load", "-q"],
        what=f"loading the GPU stand-in images into {vm_container}",
        timeout=timeout,
    )
