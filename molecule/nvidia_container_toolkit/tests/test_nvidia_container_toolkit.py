"""nvidia_container_toolkit installed from a stand-in of NVIDIA's repository (out of reach here;
see tests/fakes/nvidia_apt_repo.py): keyring, source, package, Docker's runtime; a wrong key
fails; without GPUs it configures only, or fails early when GPUs are required."""

import json
import os
from pathlib import Path

from molecule_helpers import load_image, run_playbook

SCENARIO = Path(__file__).resolve().parents[1]
REPO = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "nvidia-repo"
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
PROBE = "hostnet-llamafactory/probe:busybox"


def fingerprint(name: str) -> str:
    return (REPO / name).read_text().strip()


def keyring_fingerprints(host) -> list[str]:
    out = host.check_output(f"gpg --batch --show-keys --with-colons {KEYRING}")
    return [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]


def test_keyring_and_source_exactly_as_intended(host):
    keyring = host.file(KEYRING)
    assert (keyring.user, keyring.group, keyring.mode) == ("root", "root", 0o644)
    assert not keyring.content.startswith(b"-----BEGIN")  # binary, as signed-by wants
    assert keyring_fingerprints(host)[0] == fingerprint("fingerprint")
    source = host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.list")
    assert source.mode == 0o644
    assert source.content_string == (
        f"deb [signed-by={KEYRING}] file:///srv/nvidia-repo/stable/deb/$(ARCH) /\n"
    )
    assert "trusted=yes" not in host.check_output("cat /etc/apt/sources.list.d/*")
    assert not host.exists("apt-key") or "nvidia" not in host.run("apt-key list").stdout.lower()


def test_toolkit_installed_at_the_version_and_held(host):
    package = host.package("nvidia-container-toolkit")
    assert package.is_installed and package.version == "1.17.8-1"
    assert "hold" in host.check_output("dpkg --get-selections nvidia-container-toolkit")


def test_docker_has_the_runtime_and_kept_the_users_key(host):
    settings = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert settings["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "args": []}
    assert settings["max-concurrent-downloads"] == 7
    assert "default-runtime" not in settings
    runtimes = host.check_output("docker info --format '{{json .Runtimes}}'")
    assert "nvidia" in json.loads(runtimes)
    load_image(host, PROBE)
    # Docker starts a container through the runtime entry (the stand-in wraps runc).
    assert host.check_output(f"docker run --rm --runtime nvidia {PROBE} echo ok") == "ok"


def test_without_gpus_it_configures_only_or_fails_early(host, tmp_path):
    rc, changed, messages = run_playbook(host, SCENARIO / "role.yml", tmp_path / "a")
    assert (rc, changed) == (0, 0)
    assert "No NVIDIA GPU/driver" in messages
    rc, _changed, messages = run_playbook(
        host, SCENARIO / "role.yml", tmp_path / "b", nvidia_container_toolkit_require_gpus=True
    )
    assert rc != 0
    assert "has no working NVIDIA driver" in messages and "cuda_installer.pyz" in messages


def test_a_key_with_another_fingerprint_is_refused(host, tmp_path):
    rc, _changed, messages = run_playbook(
        host,
        SCENARIO / "role.yml",
        tmp_path,
        nvidia_container_toolkit_gpgkey_url="file:///srv/nvidia-repo/wrong-gpgkey",
    )
    assert rc != 0
    assert f"fingerprint(s) {fingerprint('wrong-fingerprint')}, not the pinned" in messages
    assert keyring_fingerprints(host)[0] == fingerprint("fingerprint")


def test_a_repository_signed_by_another_key_fails(host, tmp_path):
    rc, _changed, messages = run_playbook(
        host,
        SCENARIO / "role.yml",
        tmp_path / "wrong",
        nvidia_container_toolkit_gpgkey_url="file:///srv/nvidia-repo/wrong-gpgkey",
        nvidia_container_toolkit_gpgkey_fingerprint=fingerprint("wrong-fingerprint"),
    )
    assert rc != 0
    assert "NO_PUBKEY" in messages or "not signed" in messages, messages
    # The right key again: the host ends as converged.
    rc, _changed, messages = run_playbook(host, SCENARIO / "role.yml", tmp_path / "right")
    assert rc == 0, messages
    assert keyring_fingerprints(host)[0] == fingerprint("fingerprint")
