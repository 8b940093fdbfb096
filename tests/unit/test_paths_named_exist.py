"""Every repository path the documentation names exists: README.md, docs/*.md, the Markdown
under roles/ and tools/ (role READMEs included), and the comments and docstrings of plugins/,
roles/, playbooks/ and tools/. A path is a token that starts with one of the repository's
top-level folders (`roles/launch/tasks/finished.yml`, `../docs/gcp.md`); globs and placeholders
(`roles/*/README.md`, `molecule/SCENARIO`, `<cluster>`), paths in another repository
(`dstack@1dc61213 examples/...`) and what a run or a user creates (git-ignored paths, the
user's group_vars) are not checked."""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = (
    "plugins",
    "roles",
    "playbooks",
    "tools",
    "tests",
    "docs",
    "examples",
    "inventories",
    "molecule",
    "benchmarks",
    "changelogs",
    ".ci",
)
# A top-level folder at the start of a token (after `../` for links between folders), not in
# the middle of another path or a URL.
TOPS = "|".join(re.escape(top) for top in TOP)
PATH = re.compile(r"(?<![\w./@-])(?:\.\./)*(?P<path>(?:" + TOPS + r")/[\w./*?{}<>\[\]$-]*)")
# A file of another repository, after its name: `owner/repo@commit path`, `repo@commit path`,
# `owner/repo: path` (the text before the path, its lines joined and comment marks dropped).
ELSEWHERE = re.compile(
    r"(?:(?:[\w.-]+/)?[\w.-]+@\s*[0-9a-f]{6,40}|(?<![\w./])(?!(?:" + TOPS + r")/)[\w.-]+/[\w.-]+)"
    r"[\s:`(]*$"
)
# A GCP IAM role (roles/compute.securityAdmin), not a role of this collection.
IAM_ROLE = re.compile(r"roles/[a-z]+\.[\w.]+")
# Paths of other projects that their context names: community.docker's module_utils, which
# the image_pull and job_status modules' notes say why they do not use.
OTHER_PROJECTS = {"plugins/module_utils/_api"}
# Paths a user creates for their own run (the inventory's group_vars and vault, docs/gcp.md).
CREATED_BY_USERS = ("inventories/group_vars",)
DOCUMENTATION_NAMES = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
TEXT_SUFFIXES = {".yml", ".yaml", ".sh", ".j2", ".cfg", ".ini", ".toml", ".service", ""}


def python_documentation(text: str) -> list[str]:
    """A Python file's comments (one text, a line each), docstrings and Ansible documentation
    strings."""
    found = [
        "\n".join(
            token.string
            for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type == tokenize.COMMENT
        )
    ]
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                found.append(docstring)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if names & DOCUMENTATION_NAMES and isinstance(node.value.value, str):
                found.append(node.value.value)
    return found


def comments(text: str) -> list[str]:
    """The `#` comments of a YAML, shell or similar file (a `#` that starts a line's text or
    follows a blank), as one text, a line each."""
    return ["\n".join(m.group(1) for m in re.finditer(r"(?:^|\s)#(.*)$", text, re.MULTILINE))]


def is_python_script(path: Path) -> bool:
    first_line = path.read_bytes().split(b"\n", 1)[0]
    return first_line.startswith(b"#!") and b"python" in first_line


def sources() -> dict[str, list[str]]:
    """Each scanned file (relative to the root) -> the texts of it that are documentation."""
    found: dict[str, list[str]] = {}
    markdown = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in ("plugins", "roles", "playbooks", "tools"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path.suffix == ".md":
                markdown.append(path)
            elif path.suffix == ".py" or is_python_script(path):
                found[str(path.relative_to(ROOT))] = python_documentation(path.read_text())
            elif path.suffix in TEXT_SUFFIXES:
                try:
                    found[str(path.relative_to(ROOT))] = comments(path.read_text())
                except UnicodeDecodeError:
                    continue
    for path in markdown:
        found[str(path.relative_to(ROOT))] = [path.read_text()]
    return found


def ignored_by_git(path: str) -> bool:
    """Whether .gitignore leaves `path` out (what a run writes: results, logs, the local
    cluster's inventories)."""
    for line in (ROOT / ".gitignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith(("#", "!")):
            continue
        pattern = pattern.strip("/")
        parts = Path(path).parts
        for end in range(1, len(parts) + 1):
            if fnmatch.fnmatch("/".join(parts[:end]), pattern):
                return True
    return False


def paths_named(text: str) -> list[str]:
    """The repository paths a text names, as written (without a link's #anchor or a :line)."""
    found = []
    for match in PATH.finditer(text):
        path = match.group("path")
        if re.search(r"[*?{}<>\[\]$]|\.\.\.", path):
            continue  # a glob, a placeholder or an elision
        before = re.sub(r"\n\s*#?", " ", text[max(0, match.start() - 200) : match.start()])
        if ELSEWHERE.search(before):
            continue
        path = re.sub(r"(#.*|:\d+)$", "", path).rstrip(".,:;")
        if IAM_ROLE.fullmatch(path) or path in OTHER_PROJECTS:
            continue
        if any(re.fullmatch(r"[A-Z][A-Z0-9_]*", part) for part in path.split("/")):
            continue  # a placeholder: results/JOB/adapter, molecule/SCENARIO
        found.append(path)
    return found


def missing(texts: dict[str, list[str]]) -> list[str]:
    """'file: path' for every path named in `texts` that does not exist."""
    problems = []
    for name, parts in texts.items():
        for text in parts:
            for path in paths_named(text):
                if (ROOT / path).exists() or ignored_by_git(path):
                    continue
                if path.startswith(CREATED_BY_USERS):
                    continue
                problems.append(f"{name}: {path}")
    return sorted(set(problems))


def test_every_path_the_documentation_names_exists():
    assert missing(sources()) == []


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("see [the guide](../docs/gcp.md#1-install-the-collection).", ["docs/gcp.md"]),
        (
            "# (roles/launch/tasks/finished.yml:4) and `.ci/run`",
            [
                "roles/launch/tasks/finished.yml",
                ".ci/run",
            ],
        ),
        ("roles/*/README.md, results/JOB/x, roles/<role>/x, tests/.../y", []),
        ("dstack@1dc61213\n`examples/clusters/gcp/README.md`", []),
        ("# (GoogleCloudPlatform/cluster-toolkit@\n# 2452d0dc: examples/machine-learning/x.sh", []),
        ("(dstackai/dstack examples/clusters/gcp/README.md)", []),
        ("`roles/compute.securityAdmin` on the project", []),
        (
            "see roles/launch roles/preflight/files/x.py",
            ["roles/launch", "roles/preflight/files/x.py"],
        ),
        ("https://example.com/docs/x.md and ansible_collections/h/l/plugins/x.py", []),
        ("molecule/SCENARIO/molecule.yml", []),
    ],
)
def test_what_counts_as_a_path(text, named):
    assert paths_named(text) == named


def test_a_path_that_does_not_exist_is_reported():
    texts = {"docs/x.md": ["See plugins/module_utils/made_up.py and docs/benchmarks.md."]}
    assert missing(texts) == ["docs/x.md: plugins/module_utils/made_up.py"]


def test_run_outputs_and_user_files_are_not_reported():
    texts = {
        "README.md": [
            "benchmarks/speed/logs/x.log, inventories/local/demo.gcp/box.yml, "
            "tests/output/junit.xml, inventories/group_vars/llamafactory/vault.yml"
        ]
    }
    assert missing(texts) == []
