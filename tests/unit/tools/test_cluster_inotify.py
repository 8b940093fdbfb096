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


def neighbour_sysctl(tmp_path, hard, soft):
    (tmp_path / "gc_thresh3").write_text(f"{hard}\n")
    (tmp_path / "gc_thresh2").write_text(f"{soft}\n")
    return tmp_path


def test_the_arp_table_is_raised_only_when_the_new_vms_need_more(tmp_path, capsys):
    """The ARP table is one for every namespace: 32 VMs reaching each other overflowed the
    default 1024 entries (the preflight's probes timed out, dmesg said "neighbor table
    overflow")."""
    sysctl = neighbour_sysctl(tmp_path, 1024, 512)
    assert cluster.ensure_neighbours(8, sysctl, in_use=20) == 1024  # 20 + 8 * (2 * 8 + 16)
    assert (sysctl / "gc_thresh3").read_text() == "1024\n"
    assert cluster.ensure_neighbours(32, sysctl, in_use=20) == 2580  # 20 + 32 * (64 + 16)
    assert (sysctl / "gc_thresh3").read_text() == "2580\n"
    assert (sysctl / "gc_thresh2").read_text() == "1290\n"
    assert "raised net.ipv4.neigh.default.gc_thresh3 from 1024 to 2580" in capsys.readouterr().err


def test_the_arp_entries_in_use_are_read_from_the_kernels_statistics(tmp_path):
    stats = tmp_path / "arp_cache"
    stats.write_text(
        "entries  allocs   destroys\n0000012c 000005df 00000552\n0000012c 000005cb 00000657\n"
    )
    assert cluster.neighbours_in_use(stats) == 300
    assert cluster.neighbours_in_use(tmp_path / "absent") == 0  # no statistics: none counted
