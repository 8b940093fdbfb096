"""The action job_wait's exchange of reports between the nodes' instances on the controller: each
publishes its own rank's report atomically, and reads the others' (missing or half-written ones
are left out, not taken for empty)."""

from ansible_collections.hostnet.llamafactory.plugins.action.job_wait import ActionModule


def test_reports_are_shared_by_host_and_kind(tmp_path):
    shared = str(tmp_path)
    ranks = {"vm0": 0, "vm1": 1, "vm2": 2}
    ActionModule._publish(shared, "vm0", {"rank": 0, "log_lines": ["a"]})
    ActionModule._publish(shared, "vm1", {"rank": 1})
    ActionModule._publish(shared, "vm1", {"rank": 1, "log_lines": ["newer"]})
    (tmp_path / "vm2.json").write_text('{"rank": 2, "log_')  # being written by hand: unreadable
    ActionModule._publish(shared, "vm0", {"rank": 0, "final": True}, kind="final")
    reports = ActionModule._collect(shared, ranks)
    assert reports == {
        "vm0": {"rank": 0, "log_lines": ["a"]},
        "vm1": {"rank": 1, "log_lines": ["newer"]},
    }
    assert ActionModule._collect(shared, ranks, kind="final") == {"vm0": {"rank": 0, "final": True}}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "vm0.final",
        "vm0.json",
        "vm1.json",
        "vm2.json",
    ]
