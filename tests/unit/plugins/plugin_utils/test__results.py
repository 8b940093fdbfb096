"""job_results' helpers: the model's files, SHA256SUMS, whole writes."""

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _results as node
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _results as controller


def test_the_model_is_the_visible_files_at_the_top_of_the_output_folder(tmp_path):
    for name in ("adapter_model.safetensors", "README.md", ".hidden"):
        (tmp_path / name).write_text(name)
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "README.md")
    assert node.model_files(str(tmp_path)) == [
        {"name": "README.md", "size": 9},
        {"name": "adapter_model.safetensors", "size": 25},
    ]


def test_the_sums_file_is_what_sha256sum_checks():
    files = [{"name": "b", "sha256": "2" * 64}, {"name": "a", "sha256": "1" * 64}]
    assert controller.sums_text(files) == f"{'1' * 64}  a\n{'2' * 64}  b\n"


def test_a_write_is_whole_and_the_checksums_are_of_what_is_there(tmp_path):
    path = tmp_path / "f"
    assert controller.differs(str(path), b"new")
    controller.write(str(path), b"new")
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o644
    assert not controller.differs(str(path), b"new")
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
    assert controller.known_checksums(str(tmp_path), ["f", "absent"]) == {
        "f": node.checksum(b"new")
    }
    assert controller.folder_checksums(str(tmp_path)) == {"f": node.checksum(b"new")}
    assert controller.folder_checksums(str(tmp_path / "absent")) == {}
