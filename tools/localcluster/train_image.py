"""The local training image: LLaMA-Factory + DeepSpeed on a CPU torch, and the tiny demo assets.

The Python stack is downloaded once into a wheelhouse on this machine (`pip download`, so this
machine's pip settings apply: on a machine whose index offers only CUDA builds of torch, set
PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), then installed offline into a venv
inside a container started from the Debian "blank" image and committed. The image is cached
like the VM images (a label with the hash of its inputs).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from . import images
from .util import log, run, stream

TRAIN_IMAGE = "hostnet-llamafactory/llamafactory:0.9.5-cpu"
HERE = Path(__file__).resolve().parent / "train"
REQUIREMENTS = HERE / "requirements.txt"
INSTALL = HERE / "install.sh"
MAKE_ASSETS = HERE / "make_assets.py"
DEADLINE_S = 1800
VENV_PATH = "/opt/llamafactory/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def wheelhouse(cache_dir: Path) -> Path:
    """Download the pinned stack once (about 560 MB); reused while requirements.txt is unchanged."""
    folder = cache_dir / "wheelhouse"
    stamp = folder / ".requirements-hash"
    wanted = images.inputs_hash(REQUIREMENTS.read_bytes())
    if stamp.is_file() and stamp.read_text() == wanted:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    log(f"wheelhouse: downloading the training stack into {folder} (about 560 MB)")
    stream(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--progress-bar",
            "off",
            "-d",
            str(folder),
            "-r",
            str(REQUIREMENTS),
            "pip",
        ],
        prefix="  pip: ",
        deadline_s=DEADLINE_S,
        every=20,
    )
    (folder / "constraints.txt").write_text("torch==2.13.0\n")
    stamp.write_text(wanted)
    return folder


def ensure_train_image(client, cache_dir: Path) -> str:
    base = images.ensure_vm_image(client, images.PLATFORMS["debian12"], cache_dir, kind="blank")
    wanted = images.inputs_hash(
        "train/2",
        REQUIREMENTS.read_bytes(),
        INSTALL.read_bytes(),
        images.vm_inputs(images.PLATFORMS["debian12"], "blank"),
    )
    if images.image_inputs(client, TRAIN_IMAGE) == wanted:
        log(f"image {TRAIN_IMAGE}: cached")
        return TRAIN_IMAGE
    wheels = wheelhouse(cache_dir)
    log(f"image {TRAIN_IMAGE}: building (inputs {wanted}; about 3 min)")
    started = time.monotonic()
    builder = f"hlf-build-train-{wanted}"
    run(["docker", "rm", "-f", builder], check=False)
    try:
        stream(
            [
                "docker",
                "run",
                "--name",
                builder,
                "-v",
                f"{wheels}:/wheels:ro",
                "-v",
                f"{INSTALL}:/install.sh:ro",
                base,
                "/bin/sh",
                "/install.sh",
            ],
            prefix="  install: ",
            deadline_s=DEADLINE_S,
        )
        changes = [
            f"ENV PATH={VENV_PATH}",
            "ENV PYTHONUNBUFFERED=1",
            'CMD ["llamafactory-cli", "version"]',
            "WORKDIR /workspace",
            "LABEL " + " ".join(images._labels("train", wanted)),
        ]
        command = ["docker", "commit"]
        for change in changes:
            command += ["--change", change]
        run([*command, builder, TRAIN_IMAGE], timeout=DEADLINE_S)
    finally:
        run(["docker", "rm", "-f", builder], check=False)
    log(f"image {TRAIN_IMAGE}: built in {time.monotonic() - started:.0f} s")
    return TRAIN_IMAGE


def ensure_assets(client, cache_dir: Path) -> Path:
    """A tiny random Llama (own byte-level BPE tokenizer) and a tiny alpaca dataset, made offline
    in the training image: <cache>/assets/{model,data}."""
    image = ensure_train_image(client, cache_dir)
    out = cache_dir / "assets"
    stamp = out / ".inputs"
    wanted = images.inputs_hash(MAKE_ASSETS.read_bytes(), image)
    if stamp.is_file() and stamp.read_text() == wanted:
        return out
    out.mkdir(parents=True, exist_ok=True)
    log("assets: a tiny Llama and a tiny alpaca dataset (about 10 s)")
    run(
        [
            "docker",
            "run",
            "--rm",
            "-v",
            f"{out}:/out",
            "-v",
            f"{MAKE_ASSETS}:/make_assets.py:ro",
            image,
            "python",
            "/make_assets.py",
            "/out",
        ],
        timeout=600,
    )
    stamp.write_text(wanted)
    return out


def load_into(vm_container: str, image: str = TRAIN_IMAGE, timeout: float = 900) -> None:
    """docker save on this machine | docker load in a VM's own dockerd (skipped when present)."""
    have = subprocess.run(
        ["docker", "exec", vm_container, "docker", "image", "inspect", "-f", "{{.Id}}", image],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    want = run(["docker", "image", "inspect", "-f", "{{.Id}}", image]).stdout.strip()
    if have == want:
        return
    log(f"{vm_container}: loading {image}")
    from .util import pipe

    pipe(
        ["docker", "save", image],
        ["docker", "exec", "-i", vm_container, "docker", "load", "-q"],
        what=f"loading {image} into {vm_container}",
        timeout=timeout,
    )


def load_cluster(spec, docker_client) -> Path:
    """The training image in every VM of a running cluster (in parallel) and the demo assets
    on this machine; returns the assets folder."""
    import concurrent.futures

    from .cluster import cache_dir

    assets = ensure_assets(docker_client, cache_dir())
    started = time.monotonic()
    names = [spec.container(vm) for vm in spec.vms]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        for future in [pool.submit(load_into, name) for name in names]:
            future.result()
    log(f"cluster {spec.name}: training image in every VM ({time.monotonic() - started:.0f} s)")
    return assets
