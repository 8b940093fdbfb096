"""The model's download script (roles/launch/files/hub_download.py) without huggingface_hub:
which files it fetches and how it names a failure. It runs against the box's Hub double with
the training image's huggingface_hub in the cluster tests (test_launch.py)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "roles" / "launch" / "files" / "hub_download.py"
spec = importlib.util.spec_from_file_location("hub_download", SCRIPT)
hub_download = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hub_download)


def test_only_what_llamafactory_loads_is_fetched():
    llama3 = [
        ".gitattributes",
        "LICENSE",
        "README.md",
        "config.json",
        "generation_config.json",
        "model-00001-of-00004.safetensors",
        "model.safetensors.index.json",
        "original/consolidated.00.pth",
        "original/params.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert hub_download.select(llama3) == [
        "LICENSE",
        "README.md",
        "config.json",
        "generation_config.json",
        "model-00001-of-00004.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    both = ["config.json", "model.safetensors", "pytorch_model.bin", "pytorch_model.bin.index.json"]
    assert hub_download.select(both) == ["config.json", "model.safetensors"]
    # .bin weights alone are what there is
    assert hub_download.select(["config.json", "pytorch_model.bin"]) == [
        "config.json",
        "pytorch_model.bin",
    ]


def error(name, bases=(Exception,), status=None, text="boom"):
    cls = type(name, bases, {})
    exc = cls(text)
    if status:
        exc.response = type("R", (), {"status_code": status})()
    return exc


@pytest.mark.parametrize(
    "exc, kind",
    [
        (error("GatedRepoError", (error("RepositoryNotFoundError").__class__,)), "gated"),
        (error("RepositoryNotFoundError"), "not-found"),
        (error("RevisionNotFoundError"), "revision"),
        (error("HfHubHTTPError", status=401), "token"),
        (error("ConnectError"), "unreachable"),
        (error("LocalEntryNotFoundError"), "unreachable"),
        (OSError(28, "No space left on device"), "disk"),
        (ValueError("odd"), "failed"),
    ],
)
def test_failures_are_named(exc, kind):
    assert hub_download.classify(exc)[0] == kind
