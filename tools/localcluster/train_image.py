"""The local training images: LLaMA-Factory + DeepSpeed on a CPU torch, and the tiny demo assets.

The default image (LLaMA-Factory 0.9.5) is built from scratch: its Python stack is downloaded
once into a wheelhouse on this machine (`pip download`, so this machine's pip settings apply: on
a machine whose index offers only CUDA builds of torch, set
PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), then installed offline into a venv
inside a container started from the Debian "blank" image and committed. Other versions are
layers on another version's image: a short list of exact packages that replace the base's (see
TRAIN_IMAGES). Each image is cached like the VM images (a label with the hash of its inputs).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import images
from .util import log, run, stream

HERE = Path(__file__).resolve().parent / "train"
MAKE_ASSETS = HERE / "make_assets.py"
DEADLINE_S = 1800
VENV_PATH = "/opt/llamafactory/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class TrainImage:
    """One LLaMA-Factory version's local image. Without `base`: the requirements are the whole
    stack, installed by `install` into the Debian blank image. With `base` (another version):
    the requirements are exact packages that replace the base image's (--no-deps)."""

    version: str
    tag: str
    requirements: Path
    install: Path
    base: str | None = None


DEFAULT_VERSION = "0.9.5"
TRAIN_IMAGES = {
    "0.9.5": TrainImage(
        "0.9.5",
        "hostnet-llamafactory/llamafactory:0.9.5-cpu",
        HERE / "requirements.txt",
        HERE / "install.sh",
    ),
    # The last release before 0.9.1: it reads RANK, not NODE_RANK.
    "0.9.0": TrainImage(
        "0.9.0",
        "hostnet-llamafactory/llamafactory:0.9.0-cpu",
        HERE / "requirements-0.9.0.txt",
        HERE / "install-layer.sh",
        base="0.9.5",
    ),
}
TRAIN_IMAGE = TRAIN_IMAGES[DEFAULT_VERSION].tag
REQUIREMENTS = TRAIN_IMAGES[DEFAULT_VERSION].requirements
INSTALL = TRAIN_IMAGES[DEFAULT_VERSION].install


def wheelhouse(cache_dir: Path, version: str = DEFAULT_VERSION) -> Path:
    """Download a version's pinned packages once (the whole stack: about 560 MB; a layer's
    packages alone: about 60 MB); reused while its requirements file is unchanged."""
    spec = TRAIN_IMAGES[version]
    folder = cache_dir / ("wheelhouse" if spec.base is None else f"wheelhouse-{version}")
    stamp = folder / ".requirements-hash"
    wanted = images.inputs_hash(spec.requirements.read_bytes())
    if stamp.is_file() and stamp.read_text() == wanted:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if spec.base is None:
        what, extra = "the training stack (about 560 MB)", ["pip"]
    else:
        what, extra = f"LLaMA-Factory {version}'s packages", ["--no-deps"]
    log(f"wheelhouse: downloading {what} into {folder}")
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
            str(spec.requirements),
            *extra,
        ],
        prefix="  pip: ",
        deadline_s=DEADLINE_S,
        every=20,
    )
    if spec.base is None:
        (folder / "constraints.txt").write_text("torch==2.13.0\n")
    stamp.write_text(wanted)
    return folder


def _inputs(version: str) -> str:
    """The inputs hash of a version's image (a layer's includes its base's)."""
    spec = TRAIN_IMAGES[version]
    if spec.base is None:
        return images.inputs_hash(
            "train/2",
            spec.requirements.read_bytes(),
            spec.install.read_bytes(),
            images.vm_inputs(images.PLATFORMS["debian12"], "blank"),
        )
    return images.inputs_hash(
        "train-layer/1",
        spec.requirements.read_bytes(),
        spec.install.read_bytes(),
        _inputs(spec.base),
    )


def ensure_train_image(client, cache_dir: Path, version: str = DEFAULT_VERSION) -> str:
    """The local image of LLaMA-Factory `version` (a key of TRAIN_IMAGES), built when missing
    or stale; returns its tag."""
    spec = TRAIN_IMAGES[version]
    if spec.base is None:
        base = images.ensure_vm_image(client, images.PLATFORMS["debian12"], cache_dir, kind="blank")
    else:
        base = ensure_train_image(client, cache_dir, spec.base)
    wanted = _inputs(version)
    if images.image_inputs(client, spec.tag) == wanted:
        log(f"image {spec.tag}: cached")
        return spec.tag
    wheels = wheelhouse(cache_dir, version)
    if spec.base is None:
        log(f"image {spec.tag}: building (inputs {wanted}; about 3 min)")
        mounts = ["-v", f"{spec.install}:/install.sh:ro"]
        changes = [f"ENV PATH={VENV_PATH}", "ENV PYTHONUNBUFFERED=1", "WORKDIR /workspace"]
    else:
        log(f"image {spec.tag}: building on {base} (inputs {wanted}; about 1 min)")
        mounts = [
            "-v",
            f"{spec.install}:/install.sh:ro",
            "-v",
            f"{spec.requirements}:/requirements.txt:ro",
        ]
        changes = []  # the base's PATH and WORKDIR carry over
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
                *mounts,
                base,
                "/bin/sh",
                "/install.sh",
            ],
            prefix="  install: ",
            deadline_s=DEADLINE_S,
        )
        # docker commit takes the builder's command as CMD: set it every time.
        changes.append('CMD ["llamafactory-cli", "version"]')
        changes.append("LABEL " + " ".join(images._labels("train", wanted)))
        command = ["docker", "commit"]
        for change in changes:
            command += ["--change", change]
        run([*command, builder, spec.tag], timeout=DEADLINE_S)
    finally:
        run(["docker", "rm", "-f", builder], check=False)
    log(f"image {spec.tag}: built in {time.monotonic() - started:.0f} s")
    return spec.tag


STANDIN_DIR = Path(__file__).resolve().parent / "standin"
STANDIN_SCRIPT = STANDIN_DIR / "llamafactory-cli"
# Package metadata named llamafactory, version 0+standin: the preflight's image check reads
# the metadata (it imports nothing), so it passes, and its report names the stand-in.
STANDIN_METADATA = STANDIN_DIR / "METADATA"
STANDIN_IMAGE = "hostnet-llamafactory/standin:1"


def ensure_standin_image(client, cache_dir: Path) -> str:
    """The stand-in job's image (scale benchmarks only, see standin/README.md): the Debian
    "blank" image (python3, for the script and the rank agent) with the stand-in as
    `llamafactory-cli`, `python` naming python3 and the package metadata of "llamafactory
    0+standin". Built when missing or stale; returns its tag."""
    base = images.ensure_vm_image(client, images.PLATFORMS["debian12"], cache_dir, kind="blank")
    wanted = images.inputs_hash(
        "standin/1",
        STANDIN_SCRIPT.read_bytes(),
        STANDIN_METADATA.read_bytes(),
        images.vm_inputs(images.PLATFORMS["debian12"], "blank"),
    )
    if images.image_inputs(client, STANDIN_IMAGE) == wanted:
        log(f"image {STANDIN_IMAGE}: cached")
        return STANDIN_IMAGE
    builder = f"hlf-build-standin-{wanted}"
    run(["docker", "rm", "-f", builder], check=False)
    install = (
        "install -m 0755 /standin/llamafactory-cli /usr/local/bin/llamafactory-cli && "
        "ln -sf /usr/bin/python3 /usr/local/bin/python && "
        'mkdir -p /workspace && python -c "import sys; assert sys.version_info >= (3, 6)" && '
        'site="$(python -c "import site; print(site.getsitepackages()[0])")" && '
        'install -D -m 0644 /standin/METADATA "$site/llamafactory-0+standin.dist-info/METADATA" && '
        "python -c \"from importlib import metadata; print(metadata.version('llamafactory'))\""
    )
    try:
        run(
            [
                "docker",
                "run",
                "--name",
                builder,
                "-v",
                f"{STANDIN_DIR}:/standin:ro",
                base,
                "/bin/sh",
                "-c",
                install,
            ],
            timeout=300,
        )
        changes = [
            "ENV PYTHONUNBUFFERED=1",
            "WORKDIR /workspace",
            'CMD ["llamafactory-cli"]',
            "LABEL " + " ".join(images._labels("standin", wanted)),
        ]
        command = ["docker", "commit"]
        for change in changes:
            command += ["--change", change]
        run([*command, builder, STANDIN_IMAGE], timeout=300)
    finally:
        run(["docker", "rm", "-f", builder], check=False)
    log(f"image {STANDIN_IMAGE}: built (the stand-in job, for scale benchmarks only)")
    return STANDIN_IMAGE


HUB_CLIENT_IMAGE = "hostnet-llamafactory/hub-client:1"
# huggingface_hub (the training image's version) and what it imports, from the wheelhouse.
HUB_CLIENT_WHEELS = (
    "huggingface_hub",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "idna",
    "certifi",
    "filelock",
    "fsspec",
    "packaging",
    "pyyaml",
    "tqdm",
    "typing_extensions",
    "click",
    "hf_xet",
)


def ensure_hub_client_image(client, cache_dir: Path) -> str:
    """The Hub model's download without the 2 GB training image (the Hub fetch's tests and
    benchmark on 8 VMs): the Debian "blank" image with the training image's huggingface_hub and
    its dependencies unpacked from the wheelhouse. Built when missing or stale; its tag."""
    base = images.ensure_vm_image(client, images.PLATFORMS["debian12"], cache_dir, kind="blank")
    wheels = wheelhouse(cache_dir)
    chosen = sorted(
        w.name for w in wheels.glob("*.whl") if w.name.split("-", 1)[0].lower() in HUB_CLIENT_WHEELS
    )
    wanted = images.inputs_hash(
        "hub-client/1", *chosen, images.vm_inputs(images.PLATFORMS["debian12"], "blank")
    )
    if images.image_inputs(client, HUB_CLIENT_IMAGE) == wanted:
        return HUB_CLIENT_IMAGE
    builder = f"hlf-build-hub-client-{wanted}"
    run(["docker", "rm", "-f", builder], check=False)
    install = " && ".join(
        [f"python3 -m zipfile -e /wheels/{name} /opt/hub-client" for name in chosen]
        + [
            'site="$(python3 -c "import site; print(site.getsitepackages()[0])")"',
            'mkdir -p "$site" && echo /opt/hub-client > "$site/hub-client.pth"',
            'python3 -c "import huggingface_hub; print(huggingface_hub.__version__)"',
        ]
    )
    try:
        run(
            [
                "docker",
                "run",
                "--name",
                builder,
                "-v",
                f"{wheels}:/wheels:ro",
                base,
                "/bin/sh",
                "-c",
                install,
            ],
            timeout=300,
        )
        label = "LABEL " + " ".join(images._labels("hub-client", wanted))
        run(["docker", "commit", "--change", label, builder, HUB_CLIENT_IMAGE], timeout=300)
    finally:
        run(["docker", "rm", "-f", builder], check=False)
    log(f"image {HUB_CLIENT_IMAGE}: built (huggingface_hub alone, for the Hub fetch's tests)")
    return HUB_CLIENT_IMAGE


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
