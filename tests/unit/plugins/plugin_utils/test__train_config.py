"""The per-node training config (plugins/plugin_utils/_train_config.py): what is copied, how the
config's paths are rewritten, the notes, the errors, and the digest that tells a changed job."""

import json
import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
    _train_config as train_config,
)
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils._train_config import (
    PlanError,
    plan,
    tree_digest,
)

ROOT = Path(__file__).resolve().parents[4]
DEMO = ROOT / "examples" / "local-demo" / "llama3_lora_sft_ds3.yaml"
JOB = "/var/lib/llamafactory/jobs/demo"


@pytest.fixture
def project(tmp_path):
    """A config next to its data folder, DeepSpeed JSON and model folder."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text('{"tiny": {"file_name": "tiny.json"}}')
    (tmp_path / "data" / "tiny.json").write_text('[{"instruction": "hi", "output": "hello"}]')
    (tmp_path / "ds_z3.json").write_text('{"zero_optimization": {"stage": 3}}')
    (tmp_path / "model" / "tokenizer").mkdir(parents=True)
    (tmp_path / "model" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model" / "tokenizer" / "tokenizer.json").write_text("{}")
    config = {
        "model_name_or_path": "model",
        "stage": "sft",
        "dataset": "tiny",
        "dataset_dir": "data",
        "deepspeed": "ds_z3.json",
        "output_dir": "saves/tiny/lora/sft",
        "learning_rate": 1.0e-3,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return tmp_path, path, config


def test_copies_and_rewritten_paths(project):
    base, path, config = project
    result = plan(config, str(path), JOB + "/")
    assert result["copies"] == [
        {
            "key": "model_name_or_path",
            "src": str(base / "model"),
            "dest": f"{JOB}/model",
            "directory": True,
            "inline": True,
        },
        {
            "key": "dataset_dir",
            "src": str(base / "data"),
            "dest": f"{JOB}/data",
            "directory": True,
            "inline": True,
        },
        {
            "key": "deepspeed",
            "src": str(base / "ds_z3.json"),
            "dest": f"{JOB}/deepspeed.json",
            "directory": False,
            "inline": True,
        },
    ]
    rendered = result["config"]
    assert rendered["model_name_or_path"] == f"{JOB}/model"
    assert rendered["dataset_dir"] == f"{JOB}/data"
    assert rendered["deepspeed"] == f"{JOB}/deepspeed.json"
    assert rendered["output_dir"] == f"{JOB}/output"
    assert result["output_dir"] == f"{JOB}/output"
    assert rendered["save_on_each_node"] is True
    assert (rendered["stage"], rendered["dataset"], rendered["learning_rate"]) == (
        "sft",
        "tiny",
        1.0e-3,
    )
    assert result["notes"] == [f"output_dir saves/tiny/lora/sft becomes {JOB}/output on every node"]
    # It becomes a container label and is compared as text: 16 lower-case hex digits.
    assert re.fullmatch(r"[0-9a-f]{16}", result["digest"]), result["digest"]
    # The user's config is not changed in place.
    assert config["model_name_or_path"] == "model" and "save_on_each_node" not in config


def test_output_dir_already_right_and_save_on_each_node_kept(project):
    _base, path, config = project
    config.update(output_dir=f"{JOB}/output", save_on_each_node=False)
    result = plan(config, str(path), JOB)
    assert result["notes"] == []
    assert result["config"]["output_dir"] == f"{JOB}/output"
    assert result["config"]["save_on_each_node"] is False
    del config["output_dir"]
    assert plan(config, str(path), JOB)["notes"] == []  # no output_dir: nothing to note


def test_absolute_and_home_paths(project, monkeypatch):
    base, _path, config = project
    monkeypatch.setenv("HOME", str(base / "data" / ".."))
    monkeypatch.chdir(base)
    config.update(model_name_or_path=str(base / "model"), dataset_dir="~/data")
    result = plan(config, "train.yaml", JOB)  # config_path relative: its folder is the cwd
    sources = {c["key"]: c["src"] for c in result["copies"]}
    assert sources == {
        "model_name_or_path": str(base / "model"),
        "dataset_dir": str(base / "data"),
        "deepspeed": str(base / "ds_z3.json"),
    }


def test_a_hub_model_and_paths_inside_the_image_are_left_alone(tmp_path):
    path = tmp_path / "train.yaml"
    config = {
        "model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct",
        "stage": "sft",
        "dataset_dir": "data",
        "deepspeed": "examples/deepspeed/ds_z3_config.json",
    }
    result = plan(config, str(path), JOB)
    assert result["copies"] == []
    rendered = result["config"]
    assert rendered["model_name_or_path"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert rendered["dataset_dir"] == "data"
    assert rendered["deepspeed"] == "examples/deepspeed/ds_z3_config.json"
    assert result["notes"] == [
        "model_name_or_path meta-llama/Meta-Llama-3-8B-Instruct is a Hugging Face Hub model: "
        "fetched once (revision main) into every node's cache, the ranks load it offline",
        "dataset_dir data is not on the controller: the nodes use it as a path inside the image",
        "deepspeed examples/deepspeed/ds_z3_config.json is not on the controller: the nodes use "
        "it as a path inside the image",
    ]
    assert rendered["output_dir"] == f"{JOB}/output"


def test_a_hub_model_is_listed_to_fetch_with_its_revision(tmp_path):
    path = tmp_path / "train.yaml"
    config = {"model_name_or_path": "meta-llama/Meta-Llama-3-8B-Instruct", "stage": "sft"}
    assert plan(config, str(path), JOB)["hub"] == [
        {
            "key": "model_name_or_path",
            "repo_id": "meta-llama/Meta-Llama-3-8B-Instruct",
            "repo_type": "model",
            "revision": "main",
        }
    ]
    config["model_revision"] = "v1.0"
    assert plan(config, str(path), JOB)["hub"][0]["revision"] == "v1.0"
    assert (
        plan(dict(config, model_name_or_path="gpt2"), str(path), JOB)["hub"][0]["repo_id"] == "gpt2"
    )


@pytest.mark.parametrize(
    "value, other",
    [
        ("/opt/models/llama", {}),  # a path inside the image
        ("models/a/b", {}),  # a relative path, not an id
        ("./model", {}),
        ("qwen/Qwen2-7B", {"use_modelscope_hub": True}),  # another hub
    ],
)
def test_paths_and_other_hubs_are_not_fetched(tmp_path, value, other):
    config = {"model_name_or_path": value, "stage": "sft", **other}
    assert plan(config, str(tmp_path / "train.yaml"), JOB)["hub"] == []


def test_hub_datasets_of_a_copied_dataset_dir_are_fetched_and_pointed_at(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    info = {
        "alpaca_hub": {"hf_hub_url": "org/alpaca", "split": "train"},
        "local": {"file_name": "local.json"},
        "unused_hub": {"hf_hub_url": "org/unused"},
        "media": {"file_name": "/abs/m.json"},
    }
    (data / "dataset_info.json").write_text(json.dumps(info))
    (data / "local.json").write_text("[]")
    config = {
        "model_name_or_path": "org/model",
        "stage": "sft",
        "dataset": "alpaca_hub, local",
        "dataset_dir": "data",
    }
    result = plan(config, str(tmp_path / "train.yaml"), JOB)
    assert [(r["repo_id"], r["repo_type"]) for r in result["hub"]] == [
        ("org/model", "model"),
        ("org/alpaca", "dataset"),
    ]
    assert result["hub_offline"] is True
    assert result["config"]["dataset_dir"] == f"{JOB}/dataset_info"
    assert result["config"]["media_dir"] == f"{JOB}/data"
    folder, written = result["files"]
    assert folder == {"path": f"{JOB}/dataset_info", "state": "directory", "mode": "0750"}
    assert written["path"] == f"{JOB}/dataset_info/dataset_info.json" and written["json"]
    nodes = json.loads(written["content"])
    assert nodes["alpaca_hub"] == {
        "hf_hub_url": "/root/.cache/huggingface/hub/datasets--org--alpaca/hostnet/main.snapshot",
        "split": "train",
    }
    assert nodes["local"] == {"file_name": f"{JOB}/data/local.json"}
    assert nodes["unused_hub"] == {"hf_hub_url": "org/unused"}  # not used: left alone
    assert nodes["media"] == {"file_name": "/abs/m.json"}


def test_without_hub_datasets_the_dataset_dir_is_the_copy(project):
    _base, path, config = project
    result = plan(config, str(path), JOB)
    assert result["files"] == [] and result["hub_offline"] is True
    assert result["config"]["dataset_dir"] == f"{JOB}/data"


@pytest.mark.parametrize("where", ["ONLINE", "REMOTE:org/infos"])
def test_datasets_named_online_keep_the_ranks_online(tmp_path, where):
    config = {"model_name_or_path": "org/model", "stage": "sft", "dataset_dir": where}
    result = plan(config, str(tmp_path / "train.yaml"), JOB)
    assert result["hub_offline"] is False
    assert any("the ranks download them themselves" in note for note in result["notes"])


def test_overrides_apply_before_the_paths_are_resolved(project, tmp_path_factory):
    base, path, config = project
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "adapter").mkdir()
    (elsewhere / "adapter" / "adapter_config.json").write_text("{}")
    del config["model_name_or_path"]
    overrides = {
        "model_name_or_path": "model",  # relative to the YAML's folder
        "adapter_name_or_path": str(elsewhere / "adapter"),
        "dataset_dir": "data-in-image",
        "learning_rate": 5.0e-4,
    }
    result = plan(config, str(path), JOB, overrides)
    copies = {c["key"]: c for c in result["copies"]}
    assert copies["model_name_or_path"]["src"] == str(base / "model")
    assert copies["adapter_name_or_path"] == {
        "key": "adapter_name_or_path",
        "src": str(elsewhere / "adapter"),
        "dest": f"{JOB}/adapter",
        "directory": True,
        "inline": True,
    }
    assert "dataset_dir" not in copies
    assert result["config"]["adapter_name_or_path"] == f"{JOB}/adapter"
    assert result["config"]["dataset_dir"] == "data-in-image"
    assert result["config"]["learning_rate"] == 5.0e-4
    assert any(n.startswith("dataset_dir data-in-image is not on") for n in result["notes"])


@pytest.mark.parametrize("config", [None, ["model_name_or_path", "stage"], "stage: sft"])
def test_a_config_that_is_not_a_mapping(config):
    with pytest.raises(PlanError) as error:
        plan(config, "/home/me/train.yaml", JOB)
    assert "/home/me/train.yaml is not a LLaMA-Factory config" in str(error.value)
    assert "YAML mapping" in str(error.value)


@pytest.mark.parametrize("key", ["model_name_or_path", "stage"])
def test_a_required_key_missing(project, key):
    _base, path, config = project
    del config[key]
    with pytest.raises(PlanError) as error:
        plan(config, str(path), JOB)
    assert f"{path} has no '{key}'" in str(error.value)
    assert "llamafactory_train_overrides" in str(error.value)
    # given as an override instead, it is fine
    value = "model" if key == "model_name_or_path" else "sft"
    assert plan(config, str(path), JOB, {key: value})["config"][key] is not None


def test_deepspeed_pointing_at_a_folder(project):
    base, path, config = project
    (base / "ds").mkdir()
    config["deepspeed"] = "ds"
    with pytest.raises(PlanError) as error:
        plan(config, str(path), JOB)
    assert str(error.value) == (
        f"deepspeed {base / 'ds'} is a folder: point it at the DeepSpeed JSON file"
    )


@pytest.mark.parametrize(
    "content", ["{'zero_optimization': 3}", "", "zero_optimization:\n  stage: 3"]
)
def test_deepspeed_not_json(project, content):
    base, path, config = project
    (base / "ds_z3.json").write_text(content)
    with pytest.raises(PlanError) as error:
        plan(config, str(path), JOB)
    assert str(error.value).startswith(f"deepspeed {base / 'ds_z3.json'} is not valid JSON: ")


# --- digest -------------------------------------------------------------------------------


def test_the_digest_is_stable(project):
    _base, path, config = project
    first = plan(config, str(path), JOB)["digest"]
    assert plan(dict(config), str(path), JOB)["digest"] == first
    assert plan(dict(reversed(list(config.items()))), str(path), JOB)["digest"] == first


@pytest.mark.parametrize(
    ("change", "content"),
    [
        # Same size as before: hashed by content, not by size.
        ("data/tiny.json", '[{"instruction": "hi", "output": "hallo"}]'),
        ("ds_z3.json", '{"zero_optimization": {"stage": 2}}'),
        ("model/tokenizer/tokenizer.json", "[]"),
    ],
)
def test_the_digest_follows_the_copied_files(project, change, content):
    base, path, config = project
    before = plan(config, str(path), JOB)["digest"]
    target = base / change
    text = target.read_text()
    assert len(content) == len(text) and content != text
    target.write_text(content)
    assert plan(config, str(path), JOB)["digest"] != before
    target.write_text(text)
    assert plan(config, str(path), JOB)["digest"] == before


def test_the_digest_follows_the_config_the_job_and_new_files(project):
    base, path, config = project
    before = plan(config, str(path), JOB)["digest"]
    assert plan({**config, "learning_rate": 2.0e-3}, str(path), JOB)["digest"] != before
    assert plan(config, str(path), JOB, {"learning_rate": 2.0e-3})["digest"] != before
    assert plan(config, str(path), JOB + "-2")["digest"] != before
    # output_dir is rewritten anyway: another local output_dir is the same job
    assert plan({**config, "output_dir": "saves/other"}, str(path), JOB)["digest"] == before
    (base / "data" / "extra.json").write_text("[]")
    assert plan(config, str(path), JOB)["digest"] != before


def test_tree_digest(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    (folder / "sub").mkdir()
    (folder / "sub" / "b.txt").write_text("two")
    first = tree_digest(str(folder))
    assert first == tree_digest(str(folder))
    assert len(first) == 64
    (folder / "sub" / "b.txt").rename(folder / "sub" / "c.txt")
    renamed = tree_digest(str(folder))
    assert renamed != first
    (folder / "sub" / "c.txt").rename(folder / "sub" / "b.txt")
    assert tree_digest(str(folder)) == first
    # A single file: by content
    assert tree_digest(str(folder / "a.txt")) != tree_digest(str(folder / "sub" / "b.txt"))
    # Files over the limit (model weights) go by name and size only.
    monkeypatch.setattr(train_config, "HASH_CONTENT_LIMIT", 2)
    big = tree_digest(str(folder))
    (folder / "a.txt").write_text("eno")
    assert tree_digest(str(folder)) == big
    (folder / "a.txt").write_text("three")
    assert tree_digest(str(folder)) != big


# --- the local demo's config --------------------------------------------------------------


def test_the_local_demo_config():
    config = yaml.safe_load(DEMO.read_text())
    result = plan(config, str(DEMO), JOB, {})
    demo = DEMO.parent
    assets = (demo / "../../.cache/assets").resolve()
    copies = {c["key"]: c for c in result["copies"]}
    assert copies["deepspeed"] == {
        "key": "deepspeed",
        "src": str(demo / "ds_z3_config.json"),
        "dest": f"{JOB}/deepspeed.json",
        "directory": False,
        "inline": True,
    }
    json.loads((demo / "ds_z3_config.json").read_text())
    rendered = result["config"]
    assert rendered["deepspeed"] == f"{JOB}/deepspeed.json"
    # ./dev demo generates the assets; they may not be there when the tests run.
    if (assets / "model").is_dir():
        assert copies["model_name_or_path"]["src"] == str(assets / "model")
        assert copies["model_name_or_path"]["directory"] is True
        assert rendered["model_name_or_path"] == f"{JOB}/model"
    else:
        assert "model_name_or_path" not in copies
        assert rendered["model_name_or_path"] == "../../.cache/assets/model"
    data_note = (
        "dataset_dir ../../.cache/assets/data is not on the controller: the nodes use it as a "
        "path inside the image"
    )
    if (assets / "data").is_dir():
        assert copies["dataset_dir"]["src"] == str(assets / "data")
        assert rendered["dataset_dir"] == f"{JOB}/data"
        assert data_note not in result["notes"]
    else:
        assert "dataset_dir" not in copies
        assert data_note in result["notes"]
    notes = result["notes"]
    assert f"output_dir saves/tiny-llama/lora/sft becomes {JOB}/output on every node" in notes
    assert rendered["output_dir"] == f"{JOB}/output"
    assert rendered["save_on_each_node"] is True
    assert (rendered["stage"], rendered["dataset"], rendered["ddp_backend"]) == (
        "sft",
        "alpaca_tiny",
        "gloo",
    )
    assert set(config) <= set(rendered)
    assert set(rendered) - set(config) == {"save_on_each_node"}


def test_paths_on_a_shared_mount_are_used_in_place(project):
    """The controller may have the mount too (a VM in the VPC): still no copy of a 100 GB model."""
    base, path, config = project
    config = dict(config, model_name_or_path=str(base / "model"), dataset_dir=str(base / "data"))
    result = plan(config, str(path), JOB, shared=[str(base), "/mnt/other"])
    # A relative path is the controller's (next to the config): still copied.
    assert [c["key"] for c in result["copies"]] == ["deepspeed"]
    assert result["config"]["model_name_or_path"] == str(base / "model")
    assert result["config"]["dataset_dir"] == str(base / "data")
    assert f"dataset_dir {base / 'data'} is on the shared mount {base}" in " ".join(result["notes"])
    assert result["config"]["deepspeed"] == f"{JOB}/deepspeed.json"


def test_a_shared_mount_matches_whole_folders_only(project):
    base, path, config = project
    config = dict(config, dataset_dir=str(base / "data"))
    result = plan(config, str(path), JOB, shared=[str(base / "dat"), str(base / "data") + "/"])
    assert result["config"]["dataset_dir"] == str(base / "data")  # /data/ matches, /dat does not
    result = plan(config, str(path), JOB, shared=[str(base / "dat")])
    assert result["config"]["dataset_dir"] == f"{JOB}/data"  # copied as before


def test_copies_inline_up_to_the_limit_and_never_with_links(project, monkeypatch):
    base, path, config = project
    monkeypatch.setattr(train_config, "INLINE_COPY_LIMIT", 110)  # model 25 B, data 78, ds 35
    inline = {c["key"]: c["inline"] for c in plan(config, str(path), JOB)["copies"]}
    assert inline == {"model_name_or_path": True, "dataset_dir": True, "deepspeed": False}
    monkeypatch.setattr(train_config, "INLINE_COPY_LIMIT", 10**6)
    (base / "model" / "weights").symlink_to(base / "ds_z3.json")
    inline = {c["key"]: c["inline"] for c in plan(config, str(path), JOB)["copies"]}
    assert inline == {"model_name_or_path": False, "dataset_dir": True, "deepspeed": True}
