"""The node's side of the job logic (plugins/module_utils/_job.py) over data captured on the
local cluster (tests/unit/fixtures/job, see its README): the container inspect of running,
finished, killed and failed ranks, their timestamped logs, the checkpoint folders of two ranks
and the tail of LLaMA-Factory's trainer_log.jsonl.
"""

from __future__ import annotations

import copy
import json

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _job as job
from job_captures import (
    DIGEST_CAPTURE_RANK0,
    DIGEST_CAPTURE_RANK1,
    DIGEST_DEMO_RANK0,
    FIXTURES,
    epoch,
    inspect,
    listing,
    logs,
)

# --- parse_time ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T07:44:55.59434443Z", epoch("2026-11-30T07:44:55", 0.59434443)),
        ("2026-11-30T07:52:15.168598578Z", epoch("2026-11-30T07:52:15", 0.168598578)),
        ("2026-11-30T07:44:55Z", epoch("2026-11-30T07:44:55")),
        (
            "2026-11-30T07:45:38.627544162Z [INFO|modelcard.py:263] text",
            epoch("2026-11-30T07:45:38", 0.627544162),
        ),
        ("0001-01-01T00:00:00Z", None),
        ("", None),
        (None, None),
        ("not a time", None),
    ],
)
def test_parse_time(text, expected):
    result = job.parse_time(text)
    if expected is None:
        assert result is None
    else:
        assert result == pytest.approx(expected, abs=1e-6)


# --- container_state ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "state", "code", "digest", "rank", "started", "finished", "short_id"),
    [
        (
            "running",
            "running",
            0,
            DIGEST_CAPTURE_RANK1,
            "1",
            epoch("2026-11-30T07:51:33", 0.118172118),
            None,
            "161a9b56895e",
        ),
        (
            "exited-0",
            "exited",
            0,
            DIGEST_DEMO_RANK0,
            "0",
            epoch("2026-11-30T07:44:55", 0.59434443),
            epoch("2026-11-30T07:45:43", 0.336537192),
            "37c17fa1883a",
        ),
        (
            "killed-137",
            "exited",
            137,
            DIGEST_CAPTURE_RANK1,
            "1",
            epoch("2026-11-30T07:51:33", 0.118172118),
            epoch("2026-11-30T07:52:15", 0.168598578),
            "161a9b56895e",
        ),
        (
            "exited-1",
            "exited",
            1,
            DIGEST_CAPTURE_RANK0,
            "0",
            epoch("2026-11-30T07:51:33", 0.093179228),
            epoch("2026-11-30T07:52:18", 0.840038505),
            "984742571f2c",
        ),
    ],
)
def test_container_state_of_captured_inspects(
    name, state, code, digest, rank, started, finished, short_id
):
    result = job.container_state(inspect(name))
    assert result["state"] == state
    assert result["exit_code"] == code
    assert result["oom_killed"] is False
    assert result["error"] == ""
    assert result["id"] == short_id
    assert result["image"] == "hostnet-llamafactory/llamafactory:0.9.5-cpu"
    assert result["labels"][job.LABEL_DIGEST] == digest
    assert result["labels"][job.LABEL_RANK] == rank
    assert result["labels"][job.LABEL_JOB] == ("demo" if name == "exited-0" else "capture")
    assert result["started_at"] == pytest.approx(started, abs=1e-6)
    if finished is None:
        assert result["finished_at"] is None
    else:
        assert result["finished_at"] == pytest.approx(finished, abs=1e-6)


def test_container_state_missing_and_oom():
    assert job.container_state(None) == {"state": "missing"}
    assert job.container_state({}) == {"state": "missing"}
    raw = copy.deepcopy(inspect("killed-137"))
    raw["State"]["OOMKilled"] = True
    raw["Config"]["Labels"] = None
    result = job.container_state(raw)
    assert result["oom_killed"] is True
    assert result["labels"] == {}


# --- parse_logs ---------------------------------------------------------------------------


def test_parse_logs_merges_streams_in_time_order():
    stdout = (FIXTURES / "logs-finished.stdout").read_text()
    stderr = (FIXTURES / "logs-finished.stderr").read_text()
    expected = [
        "  train_runtime            = 0:00:03.23",
        "  train_samples_per_second =     14.827",
        "  train_steps_per_second   =      3.707",
        "Figure saved at: /var/lib/llamafactory/jobs/demo/output/training_loss.png",
        "[WARNING|2026-11-30 07:45:38] llamafactory.extras.ploting:149 >> "
        "No metric eval_loss to plot.",
        "[WARNING|2026-11-30 07:45:38] llamafactory.extras.ploting:149 >> "
        "No metric eval_accuracy to plot.",
        "[INFO|modelcard.py:263] 2026-11-30 07:45:38,627 >> Dropping the following result as "
        "it does not have all the necessary fields:",
        "{'task': {'name': 'Causal Language Modeling', 'type': 'text-generation'}}",
    ]
    newest = epoch("2026-11-30T07:45:38", 0.627644621)
    for streams in ((stdout, stderr), (stderr, stdout)):
        lines, last = job.parse_logs(*streams)
        assert lines == expected
        assert last == pytest.approx(newest, abs=1e-6)


def test_parse_logs_interleaves_by_time():
    stdout = "2026-11-30T07:00:01.000000001Z out 1\n2026-11-30T07:00:03Z out 3\n"
    stderr = "2026-11-30T07:00:02.5Z err 2\n2026-11-30T07:00:04.25Z err 4\n"
    lines, last = job.parse_logs(stdout, stderr)
    assert lines == ["out 1", "err 2", "out 3", "err 4"]
    assert last == pytest.approx(epoch("2026-11-30T07:00:04", 0.25))


def test_parse_logs_of_a_killed_rank_and_empty_logs():
    lines, last = logs("killed")
    assert len(lines) == 40
    assert lines[0] == '  "pretraining_tp": 1,'
    assert lines[-1] == "  return func(*args, **kwargs)"
    assert "" in lines  # a blank line with a timestamp is kept as a line
    assert last == pytest.approx(epoch("2026-11-30T07:52:14", 0.935407402))
    assert job.parse_logs("", None) == ([], None)


def test_parse_logs_keeps_untimestamped_lines_last():
    lines, last = job.parse_logs("plain line\n2026-11-30T07:00:01Z stamped\n\n")
    assert lines == ["stamped", "plain line"]
    assert last == pytest.approx(epoch("2026-11-30T07:00:01"))


def test_parse_logs_keeps_the_last_carriage_return_frame():
    stderr = (
        "2026-11-30T07:00:01Z  10%|#         | 1/10 [00:01<00:09]\r"
        " 50%|#####     | 5/10 [00:05<00:05]\r"
        "100%|##########| 10/10 [00:10<00:00]\n"
        "2026-11-30T07:00:02Z {'loss': 5.6857}\n"
    )
    lines = job.parse_logs("", stderr)[0]
    assert lines == ["100%|##########| 10/10 [00:10<00:00]", "{'loss': 5.6857}"]


# --- last_progress ------------------------------------------------------------------------


def test_last_progress_of_the_captured_tail_carries_the_loss_over():
    tail = (FIXTURES / "trainer_log-tail.jsonl").read_text()
    assert "loss" not in json.loads(tail.splitlines()[-1])  # the real last record has none
    assert job.last_progress(tail) == {
        "step": 400,
        "total": 400,
        "loss": 5.685694694519043,
        "percentage": 100.0,
    }


def test_last_progress_skips_partial_and_foreign_lines():
    tail = (
        '_steps": 3, "total_steps": 10}\n'  # a line cut by the tail
        '{"current_steps": 4, "total_steps": 10, "loss": 2.5, "percentage": 40.0}\n'
        '["not", "a", "record"]\n'
        '{"eval_loss": 1.0}\n'
        '{"current_steps": 5, "total_steps": 10, "loss": 2.25, "percentage": 50.0}\n'
    )
    assert job.last_progress(tail) == {"step": 5, "total": 10, "loss": 2.25, "percentage": 50.0}
    assert job.last_progress("") is None
    assert job.last_progress(None) is None
    assert job.last_progress('{"current_steps": 1, "total_steps": 2}') == {
        "step": 1,
        "total": 2,
        "loss": None,
        "percentage": None,
    }


# --- checkpoints --------------------------------------------------------------------------


def test_complete_checkpoints_of_both_captured_ranks():
    rank0, rank1 = listing(0), listing(1)
    assert "latest" in rank0["checkpoint-10"] and "latest" not in rank1["checkpoint-10"]
    assert job.complete_checkpoints(rank0) == [10]
    assert job.complete_checkpoints(rank1) == [10]


def test_incomplete_checkpoints_are_left_out():
    files = listing(1)["checkpoint-10"]
    without_state = [f for f in files if f != "trainer_state.json"]
    without_shards = [f for f in files if f != "global_step10"]
    listing_ = {
        "checkpoint-10": files,
        # still being written: no trainer state yet
        "checkpoint-20": [f if f != "global_step10" else "global_step20" for f in without_state],
        # DeepSpeed used (a shard folder is there) but not this step's
        "checkpoint-30": [*without_shards, "global_step20"],
        # no DeepSpeed at all: the trainer state is enough
        "checkpoint-40": [f for f in without_shards if f != "rng_state_1.pth"],
        # sorted by step, not by name
        "checkpoint-5": [f if f != "global_step10" else "global_step5" for f in files],
        # a shard folder of another step only: not this checkpoint's
        "checkpoint-50": files,
        "checkpoint-last": files,
        "runs": ["events.out.tfevents"],
    }
    assert job.complete_checkpoints(listing_) == [5, 10, 40]
    assert job.complete_checkpoints({}) == []
    assert job.complete_checkpoints(None) == []


def test_deepspeed_checkpoint_without_its_shard_folder_is_incomplete():
    files = [f for f in listing(0)["checkpoint-10"] if f != "global_step10"]
    assert "latest" in files
    assert job.complete_checkpoints({"checkpoint-10": files}) == []


# --- checkpoint_listing (the node's output folder) ----------------------------------------


def test_checkpoint_listing_holds_only_checkpoint_folders(tmp_path):
    for line in (FIXTURES / "checkpoints-rank1.txt").read_text().splitlines():
        name, _colon, children = line.partition(":")
        for child in children.split():
            if child.startswith("global_step"):
                (tmp_path / name / child).mkdir(parents=True)
            else:
                (tmp_path / name).mkdir(exist_ok=True)
                (tmp_path / name / child).write_text("")
    (tmp_path / "checkpoint-20").mkdir()  # being written
    (tmp_path / "checkpoint-30").write_text("")  # a file, not a folder
    (tmp_path / "checkpoint-final").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "trainer_log.jsonl").write_text("")
    listing = job.checkpoint_listing(str(tmp_path))
    assert sorted(listing) == ["checkpoint-10", "checkpoint-20"]
    assert sorted(listing["checkpoint-10"]) == sorted(
        (FIXTURES / "checkpoints-rank1.txt").read_text().partition(":")[2].split()
    )
    assert listing["checkpoint-20"] == []
    assert job.complete_checkpoints(listing) == [10]


def test_checkpoint_listing_of_a_missing_folder(tmp_path):
    assert job.checkpoint_listing(str(tmp_path / "absent")) == {}
    assert job.checkpoint_listing(str(tmp_path)) == {}
