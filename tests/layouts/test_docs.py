"""docs/layouts.md is a REPL session: every ``>>>`` line runs and its output is checked."""

import doctest
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "layouts.md"


def test_layouts_doc_session():
    result = doctest.testfile(str(DOC), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 50
    assert result.failed == 0
