"""docker_host_facts' parsers over captured output (tests/unit/fixtures/docker_host, see its
README)."""

import grp
import os
import pwd
from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _docker_host as host

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "docker_host"


def test_installed_packages_of_a_captured_dpkg_query():
    found = host.installed_packages((FIXTURES / "dpkg-query.stdout").read_text())
    assert found == {
        "ca-certificates": "20230311+deb12u1",
        "docker.io": "20.10.24+dfsg1-1+deb12u1+b6",
        "gnupg": "2.2.40-1.1+deb12u2",
    }
    # The names dpkg never heard of are only on stderr (rc 1): not installed.
    assert "python3-requests" in (FIXTURES / "dpkg-query.stderr").read_text()


@pytest.mark.parametrize(
    ("line", "installed"),
    [
        ("docker.io\t20.10.24\tii ", {"docker.io": "20.10.24"}),
        ("docker.io\t20.10.24\trc ", {}),  # removed, its config files kept
        ("docker.io\t\tun ", {}),  # known, not installed
        ("libc6:amd64\t2.36-9\tii ", {"libc6": "2.36-9"}),
        ("garbage", {}),
    ],
)
def test_installed_packages_by_status(line, installed):
    assert host.installed_packages(line + "\n") == installed


def test_dockerd_version():
    captured = (FIXTURES / "dockerd-version.stdout").read_text()
    assert host.dockerd_version(captured) == "20.10.24"
    assert host.dockerd_version("Docker version 27.3.1, build ce12230") == "27.3.1"
    assert host.dockerd_version("") is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "active",
            {
                "loaded": True,
                "active": True,
                "enabled": True,
                "state": "active",
                "since": "1725628207",
            },
        ),
        (
            "missing",
            {
                "loaded": False,
                "active": False,
                "enabled": False,
                "state": "inactive",
                "since": None,
            },
        ),
    ],
)
def test_unit_state_of_captured_systemctl_show(name, expected):
    text = (FIXTURES / f"systemctl-show-{name}.stdout").read_text()
    assert host.unit_state(text) == expected


def test_unit_state_stopped_and_disabled():
    text = "LoadState=loaded\nActiveState=failed\nUnitFileState=disabled\n"
    assert host.unit_state(text) == {
        "loaded": True,
        "active": False,
        "enabled": False,
        "state": "failed",
        "since": None,
    }


def test_file_attributes_names_owner_group_and_mode(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("{}\n")
    os.chmod(path, 0o640)
    found = host.file_attributes(os.stat(path))
    assert found == {
        "owner": pwd.getpwuid(os.getuid()).pw_name,
        "group": grp.getgrgid(os.getgid()).gr_name,
        "mode": "0640",
    }


def test_file_attributes_of_unknown_ids_are_the_ids():
    unknown = 2**31 - 7  # no such user or group on a test machine
    st = os.stat_result((0o100600, 0, 0, 1, unknown, unknown, 3, 0, 0, 0))
    assert host.file_attributes(st) == {
        "owner": str(unknown),
        "group": str(unknown),
        "mode": "0600",
    }


def test_os_release_of_captured_debian_12():
    text = (FIXTURES / "os-release-debian12").read_text()
    assert host.os_release(text, "x86_64") == {
        "family": "Debian",
        "distribution": "debian",
        "version": "12",
        "release": "bookworm",
        "architecture": "x86_64",
        "name": "Debian GNU/Linux 12 (bookworm)",
    }


@pytest.mark.parametrize(
    "text, family, release",
    [
        (
            'ID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\nVERSION_ID="24.04"\n',
            "Debian",
            "noble",
        ),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n', "rocky", ""),
        ("", "linux", ""),
    ],
)
def test_os_release_family(text, family, release):
    found = host.os_release(text, "aarch64")
    assert (found["family"], found["release"], found["architecture"]) == (
        family,
        release,
        "aarch64",
    )


@pytest.mark.parametrize(
    ("dpkg_version", "expected"),
    [
        ("20.10.24+dfsg1-1+deb12u1", "20.10.24"),  # Debian 12's docker.io
        ("5:27.3.1-1~debian.12~bookworm", "27.3.1"),  # Docker's docker-ce
        ("24.0.7-0ubuntu4.1", "24.0.7"),  # Ubuntu 24.04's docker.io
        ("", None),
        ("git20240101", None),
    ],
)
def test_package_version(dpkg_version, expected):
    assert host.package_version(dpkg_version) == expected


def test_package_owning_reads_dpkgs_file_lists(tmp_path):
    (tmp_path / "docker.io.list").write_text("/.\n/usr/sbin\n/usr/sbin/dockerd\n/usr/bin/docker\n")
    (tmp_path / "containerd:amd64.list").write_text("/usr/bin/containerd\n")
    packages = ["ca-certificates", "containerd", "docker.io"]  # no list for the first: skipped
    assert host.package_owning("/usr/sbin/dockerd", packages, str(tmp_path)) == "docker.io"
    assert host.package_owning("/usr/bin/containerd", packages, str(tmp_path)) == "containerd"
    assert host.package_owning("/usr/local/bin/dockerd", packages, str(tmp_path)) is None
    assert host.package_owning("/usr/sbin", packages, str(tmp_path)) == "docker.io"
