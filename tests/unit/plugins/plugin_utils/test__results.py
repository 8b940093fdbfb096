"""job_results' helpers: matching names as ansible.builtin.find does, the listing, whole writes."""

from ansible_collections.hostnet.llamafactory.plugins.module_utils import _results as node
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _results as controller


def test_matching_names_are_sorted_and_hidden_ones_need_a_pattern_of_their_own():
    names = ["b.safetensors", "adapter_config.json", ".x.safetensors", "README.md", ".keep"]
    assert node.matching(names, ["adapter_*", "*.safetensors"]) == [
        "adapter_config.json",
        "b.safetensors",
    ]
    assert node.matching(names, [".k*"]) == [".keep"]


def test_the_listing_names_each_file_and_its_size_under_its_header():
    files = [{"name": "b", "size": 2}, {"name": "a", "size": 10}]
    assert controller.listing_text("h:/out", files) == "# h:/out\na 10\nb 2\n"
    assert controller.listing_text("", []) == "\n"


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
