"""The local-cluster tool's command helpers: failures and deadlines are errors that say so."""

import pytest
from localcluster.util import ClusterError, pipe, run, stream, wait_until


def test_pipe_passes_data_and_checks_both_sides(tmp_path):
    out = tmp_path / "out"
    pipe(["printf", "hello"], ["sh", "-c", f"cat > {out}"], what="copy")
    assert out.read_text() == "hello"
    with pytest.raises(ClusterError, match="copy failed"):
        pipe(["sh", "-c", "echo oops >&2; exit 3"], ["cat"], what="copy")
    with pytest.raises(ClusterError, match=r"copy failed: .*nope"):
        pipe(["printf", "x"], ["sh", "-c", "cat >/dev/null; echo nope >&2; exit 1"], what="copy")
    with pytest.raises(ClusterError, match="did not finish within 1 s"):
        pipe(["sleep", "30"], ["sleep", "30"], what="slow", timeout=1)


def test_run_and_stream_fail_with_the_output():
    assert run(["echo", "hi"]).stdout == "hi\n"
    with pytest.raises(ClusterError, match="boom"):
        run(["sh", "-c", "echo boom >&2; exit 1"])
    with pytest.raises(ClusterError, match="last words"):
        stream(["sh", "-c", "echo last words; exit 2"], prefix="t: ", deadline_s=30)
    with pytest.raises(ClusterError, match="past its 1 s deadline"):
        stream(["sleep", "30"], prefix="t: ", deadline_s=1)


def test_wait_until_names_what_it_waited_for():
    def refused():
        raise OSError("refused")

    assert wait_until("x", lambda: 5, deadline_s=1) == 5
    with pytest.raises(ClusterError, match="sshd not ready within 1 s: refused"):
        wait_until("sshd", refused, deadline_s=1, interval=0.1)
