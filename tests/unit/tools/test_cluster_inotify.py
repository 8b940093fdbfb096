"""The local cluster raises the host's inotify limit for many VMs (tools/localcluster/cluster.py):
each VM's systemd and dockerd take 8 instances; the default of 128 stops the ~16th VM's systemd."""

import ctypes
import os

import pytest
from localcluster import cluster
from localcluster.util import ClusterError


def test_the_limit_is_raised_only_when_the_new_vms_need_more(tmp_path, capsys):
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    assert cluster.ensure_inotify(2, limit, in_use=16) == 128  # 16 + 2 * 8 + 16 spare
    assert limit.read_text() == "128\n"
    assert cluster.ensure_inotify(32, limit, in_use=16) == 288
    assert limit.read_text() == "288\n"
    assert "raised fs.inotify.max_user_instances from 128 to 288" in capsys.readouterr().err


class ReadOnly:
    def read_text(self):
        return "128\n"

    def write_text(self, _text):
        raise PermissionError(13, "Permission denied")


def test_a_limit_that_cannot_be_raised_names_the_command():
    with pytest.raises(ClusterError, match=r"sysctl -w fs.inotify.max_user_instances=288"):
        cluster.ensure_inotify(32, ReadOnly(), in_use=16)


def test_the_instances_in_use_are_counted_here():
    libc = ctypes.CDLL(None, use_errno=True)
    held = [libc.inotify_init1(os.O_CLOEXEC) for _attempt in range(5)]
    try:
        assert all(fd >= 0 for fd in held)
        assert cluster.inotify_in_use() >= 5  # ours at least (this process's fds are read too)
    finally:
        for fd in held:
            os.close(fd)
