"""The test tree's rules: no two test files share a name (pytest enforces it only when it collects
everything: tests/ holds no packages, so pytest imports each file by its basename), and the unit
tests of plugins/ mirror what they test, as community.docker's do."""

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_two_test_files_share_a_name():
    files = [p for p in (ROOT / "tests").rglob("test_*.py") if "output" not in p.parts]
    repeated = {name for name, count in Counter(p.name for p in files).items() if count > 1}
    assert not repeated, sorted(str(p.relative_to(ROOT)) for p in files if p.name in repeated)


def misnamed(tests: list[str], plugins: set[str]) -> list[str]:
    """The test files (paths under tests/unit/plugins, as KIND/test_NAME.py) that name no plugin
    file (paths under plugins/, as KIND/NAME.py): tests/unit/plugins/KIND/test_NAME.py tests
    plugins/KIND/NAME.py (module_utils/_nic.py: test__nic.py). Where another kind's test of the
    same NAME holds that file name (the names must differ), the kind is added, singular:
    modules/test_image_pull_module.py beside action/test_image_pull.py."""
    names = Counter(Path(t).name for t in tests)
    wrong = []
    for test in tests:
        kind, name = test.split("/", 1) if "/" in test else (test, "")
        stem = name.removeprefix("test_").removesuffix(".py")
        if not name.startswith("test_") or "/" in name:
            wrong.append(test)
        elif f"{kind}/{stem}.py" in plugins:
            continue
        else:
            suffix = "_" + kind.removesuffix("s")
            plain = stem.removesuffix(suffix)
            taken = names[f"test_{plain}.py"] > 0 and f"{kind}/test_{plain}.py" not in tests
            if not (stem.endswith(suffix) and f"{kind}/{plain}.py" in plugins and taken):
                wrong.append(test)
    return wrong


def test_each_plugin_test_file_names_the_plugin_file_it_tests():
    base = ROOT / "tests" / "unit" / "plugins"
    tests = sorted(p.relative_to(base).as_posix() for p in base.rglob("test_*.py"))
    plugins = {p.relative_to(ROOT / "plugins").as_posix() for p in (ROOT / "plugins").rglob("*.py")}
    assert len(tests) > 30 and "module_utils/_nic.py" in plugins  # both trees were read
    assert misnamed(tests, plugins) == [], "rename each after plugins/KIND/NAME.py"


def test_the_mirror_rule_catches_a_misnamed_file():
    plugins = {"modules/image_pull.py", "action/image_pull.py", "module_utils/_nic.py"}
    good = ["action/test_image_pull.py", "modules/test_image_pull_module.py"]
    assert misnamed([*good, "module_utils/test__nic.py"], plugins) == []
    assert misnamed(["module_utils/test_nic.py"], plugins) == ["module_utils/test_nic.py"]
    # The kind is added only where the plain name is another kind's.
    assert misnamed(["modules/test_image_pull_module.py"], plugins) == [
        "modules/test_image_pull_module.py"
    ]
    assert misnamed([*good, "filter/test_ranks_and_typos.py"], plugins) == [
        "filter/test_ranks_and_typos.py"
    ]
    assert misnamed(["modules/deep/test_image_pull.py"], plugins) == [
        "modules/deep/test_image_pull.py"
    ]


def test_every_filter_plugin_has_its_unit_test():
    filters = sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.py"))
    tests = ROOT / "tests" / "unit" / "plugins" / "filter"
    assert len(filters) > 10  # the folder was read
    assert [f for f in filters if not (tests / f"test_{f}.py").is_file()] == []
