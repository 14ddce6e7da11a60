"""The theorem pages' test lists (docs/_ext/theorem_tests.py) fail the docs build when they should.

A theorem of T1..T10 with no test, a theorem no page lists, and a marker naming no theorem
(or placed where the docs cannot see its test) are all warnings, so ``-W`` fails.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("docutils")  # docs/_ext imports it at module level

ROOT = Path(__file__).resolve().parent.parent
EXT = ROOT / "docs" / "_ext"
sys.path.insert(0, str(EXT))

import theorem_tests  # noqa: E402

GOOD_TESTS = '''
import pytest

t2 = pytest.mark.theorem("T2")


@pytest.mark.theorem("T1")
def test_one():
    """Checks T1."""


@t2
def test_two():
    """Checks T2."""


@pytest.mark.theorem("T1")
class TestGroup:
    @pytest.mark.theorem("T2")
    def test_both(self):
        """Checks T1 and T2."""
'''

BAD_TESTS = """
import pytest

pytestmark = pytest.mark.theorem("T11")
NAME = "T1"


@pytest.mark.theorem("t1")
def test_lower():
    pass


@pytest.mark.theorem(NAME)
def test_variable():
    pass


@pytest.mark.theorem()
def test_empty():
    pass


@pytest.mark.parametrize("x", [pytest.param(1, marks=pytest.mark.theorem("T1"))])
def test_param(x):
    pass


class TestInner:
    @pytest.mark.theorem("T1 ")
    def test_space(self):
        pass


def helper():
    return pytest.mark.theorem("T3")
"""


def _write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_find_marker_problems_names_each_bad_marker(tmp_path):
    folder = _write(tmp_path / "tests", {"test_good.py": GOOD_TESTS, "test_bad.py": BAD_TESTS})
    problems, errors = theorem_tests.find_marker_problems(folder)
    assert errors == []
    assert all(p.path == "tests/test_bad.py" for p in problems), problems
    found = {(p.owner, p.lineno, "names no theorem" in p.message) for p in problems}
    lines = BAD_TESTS.splitlines()

    def line_of(text: str) -> int:
        return next(i for i, line in enumerate(lines, start=1) if text in line)

    assert ("<module>", line_of('pytestmark = pytest.mark.theorem("T11")'), True) in found
    assert ("test_lower", line_of('theorem("t1")'), True) in found
    assert ("test_variable", line_of("theorem(NAME)"), True) in found
    assert ("test_empty", line_of("theorem()"), True) in found
    assert ("TestInner::test_space", line_of('theorem("T1 ")'), True) in found
    # valid names, but nowhere the docs can attach them to a test
    assert ("test_param", line_of("pytest.param"), False) in found
    assert ("helper", line_of('theorem("T3")'), False) in found
    assert len(problems) == 7, "\n".join(map(str, problems))
    messages = "\n".join(map(str, problems))
    for shown in ("'T11'", "'t1'", "<NAME>", "<no argument>", "'T1 '"):
        assert f"theorem({shown}) names no theorem of T1, T2" in messages


UNPACKED_TESTS = """
import pytest

a, b = pytest.mark.theorem("T1"), pytest.mark.theorem("T2")
unused = pytest.mark.theorem("T3")


@a
def test_unpacked():
    \"\"\"The marker is lost: the docs read no alias from a tuple assignment.\"\"\"
"""


def test_a_marker_no_test_receives_is_a_problem(tmp_path):
    """Markers the scan of the tests never attaches (unpacked or unused aliases) are reported."""
    folder = _write(tmp_path / "tests", {"test_unpacked.py": UNPACKED_TESTS})
    tests, _, _ = theorem_tests.find_theorem_tests(folder, "T1")
    assert tests == []
    problems, errors = theorem_tests.find_marker_problems(folder)
    assert errors == []
    lines = UNPACKED_TESTS.splitlines()
    unpacked = next(i for i, line in enumerate(lines, start=1) if line.startswith("a, b ="))
    unused = next(i for i, line in enumerate(lines, start=1) if line.startswith("unused ="))
    assert [(p.lineno, p.owner) for p in problems] == [
        (unpacked, "<module>"),
        (unpacked, "<module>"),
        (unused, "<module>"),
    ], "\n".join(map(str, problems))
    assert all("not on a test function" in p.message for p in problems)


def test_find_marker_problems_accepts_the_good_forms(tmp_path):
    folder = _write(tmp_path / "tests", {"test_good.py": GOOD_TESTS})
    assert theorem_tests.find_marker_problems(folder) == ([], [])
    tests, _, _ = theorem_tests.find_theorem_tests(folder, "T2")
    assert [t.name for t in tests] == ["test_two", "TestGroup::test_both"]


def test_the_real_test_suite_has_no_marker_problem():
    problems, errors = theorem_tests.find_marker_problems(ROOT / "tests")
    assert errors == []
    assert problems == [], "\n".join(map(str, problems))
    for theorem in theorem_tests.THEOREMS:
        tests, _, _ = theorem_tests.find_theorem_tests(ROOT / "tests", theorem)
        assert tests, f"no test is marked for {theorem}"


# -- whole builds ---------------------------------------------------------------------------

CONF = f"""
import sys
sys.path.insert(0, {str(EXT)!r})
extensions = ["theorem_tests"]
root_doc = "index"
html_theme = "basic"
theorem_tests_dir = "../tests"
"""


def _build(tmp_path: Path, index: str, tests: dict[str, str], conf_extra: str = ""):
    src = tmp_path / "docs"
    src.mkdir()
    (src / "conf.py").write_text(CONF + conf_extra)
    (src / "index.rst").write_text("Title\n=====\n\n" + textwrap.dedent(index))
    _write(tmp_path / "tests", tests)
    return _sphinx(src, tmp_path / "out"), tmp_path / "out"


def _sphinx(src: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            src,
            out,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


ONLY_T1_T2 = '\ntheorem_tests_theorems = ("T1", "T2")\n'
LIST_T1_T2 = ".. theorem-tests:: T1\n\n.. theorem-tests:: T2\n"


def test_a_complete_project_builds_and_lists_the_tests(tmp_path):
    res, out = _build(tmp_path, LIST_T1_T2, {"test_good.py": GOOD_TESTS}, ONLY_T1_T2)
    assert res.returncode == 0, res.stderr
    html = (out / "index.html").read_text()
    assert "tests/test_good.py::test_one" in html
    assert "Checks T1." in html
    assert "tests/test_good.py::TestGroup::test_both" in html


def test_every_theorem_t1_to_t10_must_be_listed_by_a_page(tmp_path):
    res, _ = _build(tmp_path, ".. theorem-tests:: T1\n", {"test_good.py": GOOD_TESTS})
    assert res.returncode != 0
    err = res.stderr
    assert "theorem T2 is listed by no page" in err
    assert "2 test(s) carry its marker" in err
    for k in range(3, 11):
        assert f"theorem T{k} is listed by no page" in err
        assert f"no test in {tmp_path / 'tests'} is marked @pytest.mark.theorem('T{k}')" in err
    assert "theorem T1 is listed" not in err
    assert "[theorem_tests.unlisted]" in err


def test_a_new_test_file_is_listed_by_the_next_build(tmp_path):
    """The page and the files it read are unchanged; the page is read again all the same."""
    res, out = _build(tmp_path, LIST_T1_T2, {"test_good.py": GOOD_TESTS}, ONLY_T1_T2)
    assert res.returncode == 0, res.stderr
    assert "tests/test_more.py::test_more" not in (out / "index.html").read_text()
    _write(
        tmp_path / "tests",
        {
            "test_more.py": 'import pytest\n\n\n@pytest.mark.theorem("T1")\ndef test_more():\n'
            '    """Checks T1 again."""\n'
        },
    )
    res = _sphinx(tmp_path / "docs", out)
    assert res.returncode == 0, res.stderr
    html = (out / "index.html").read_text()
    assert "tests/test_more.py::test_more" in html
    assert "Checks T1 again." in html


def test_a_listed_theorem_without_a_test_fails(tmp_path):
    tests = {"test_one.py": '@__import__("pytest").mark.theorem("T1")\ndef test_a():\n    pass\n'}
    res, out = _build(tmp_path, LIST_T1_T2, tests, ONLY_T1_T2)
    assert res.returncode != 0
    assert "index.rst:" in res.stderr
    assert "no test in" in res.stderr and "theorem('T2')" in res.stderr
    assert "[theorem_tests.empty]" in res.stderr
    assert "No test is marked for theorem T2 yet." in (out / "index.html").read_text()


def test_a_test_file_that_does_not_parse_is_reported_once(tmp_path):
    tests = {"test_good.py": GOOD_TESTS, "test_broken.py": "def test_x(:\n    pass\n"}
    res, _ = _build(tmp_path, LIST_T1_T2, tests, ONLY_T1_T2)
    assert res.returncode != 0
    assert res.stderr.count("theorem-tests: cannot parse") == 1, res.stderr
    assert f"cannot parse {tmp_path / 'tests' / 'test_broken.py'}: " in res.stderr
    assert "[theorem_tests.parse]" in res.stderr


def test_a_marker_naming_no_theorem_fails_with_file_line_and_test(tmp_path):
    tests = {
        "test_good.py": GOOD_TESTS,
        "test_typo.py": "import pytest\n\n\n@pytest.mark.theorem('T11')\ndef test_typo():\n"
        "    pass\n",
    }
    res, _ = _build(tmp_path, LIST_T1_T2, tests, ONLY_T1_T2)
    assert res.returncode != 0
    expected = f"{tmp_path / 'tests' / 'test_typo.py'}:4: WARNING: theorem-tests: the marker"
    assert expected in res.stderr, res.stderr
    assert "theorem('T11') names no theorem of T1, T2 (test test_typo)" in res.stderr
    assert "[theorem_tests.marker]" in res.stderr


def test_a_marked_test_without_docstring_fails(tmp_path):
    tests = {
        "test_good.py": GOOD_TESTS,
        "test_bare.py": "import pytest\n\n\n@pytest.mark.theorem('T2')\ndef test_bare():\n"
        "    pass\n",
    }
    res, out = _build(tmp_path, LIST_T1_T2, tests, ONLY_T1_T2)
    assert res.returncode != 0
    assert "tests/test_bare.py::test_bare is marked for T2 but has no docstring" in res.stderr
    assert "[theorem_tests.summary]" in res.stderr
    html = (out / "index.html").read_text()
    assert "<th" in html and "What it checks" in html and "Checks T2." in html


def test_a_directive_naming_no_theorem_fails(tmp_path):
    res, _ = _build(
        tmp_path,
        LIST_T1_T2 + "\n.. theorem-tests:: T11\n",
        {"test_good.py": GOOD_TESTS},
        ONLY_T1_T2,
    )
    assert res.returncode != 0
    assert "'T11' is not a theorem of theorem_tests_theorems (T1, T2)" in res.stderr


def test_the_real_docs_check_all_ten_theorems():
    conf: dict = {"__file__": str(ROOT / "docs" / "conf.py")}
    exec(compile((ROOT / "docs" / "conf.py").read_text(), "conf.py", "exec"), conf)
    assert tuple(conf.get("theorem_tests_theorems", theorem_tests.THEOREMS)) == tuple(
        f"T{i}" for i in range(1, 11)
    )
    assert "theorem_tests" in conf["extensions"]
    assert "theorem_tests.unlisted" not in conf.get("suppress_warnings", [])
    assert not any(w.startswith("theorem_tests") for w in conf.get("suppress_warnings", []))
