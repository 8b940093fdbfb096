"""The roles' defaults point at the real upstream sources (the molecule scenarios override them
with local stand-ins, since NVIDIA's and Docker's repositories are out of reach here)."""

from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


def defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


def role_vars(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text())


def test_nvidia_defaults_are_nvidias_repository_and_key():
    nvidia = defaults("nvidia_container_toolkit")
    assert nvidia["nvidia_container_toolkit_repo_url"] == (
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
    )
    assert nvidia["nvidia_container_toolkit_gpgkey_url"] == (
        "https://nvidia.github.io/libnvidia-container/gpgkey"
    )
    assert nvidia["nvidia_container_toolkit_gpgkey_fingerprint"] == (
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
    )
    assert nvidia["nvidia_container_toolkit_require_gpus"] is False
    fixed = role_vars("nvidia_container_toolkit")
    assert fixed["nvidia_container_toolkit_package"] == "nvidia-container-toolkit"
    assert fixed["nvidia_container_toolkit_keyring"] == (
        "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
    )


def test_docker_defaults():
    docker = defaults("docker_engine")
    assert docker["docker_engine_source"] == "distro"
    assert docker["docker_engine_distro_packages"] == ["docker.io"]
    assert docker["docker_engine_docker_repo_key_fingerprint"] == (
        "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
    )
    assert docker["docker_engine_cgroup_driver"] == "cgroupfs"
    assert docker["docker_engine_restart_allowed"] is False
