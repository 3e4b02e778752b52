"""docs/layouts.md and docs/workbench.md are REPL sessions: every ``>>>`` line runs and its output
is checked; the console blocks of docs/workbench.md are re-run through the real dispatcher."""

import contextlib
import doctest
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from cute_kernels.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("page, minimum", [("layouts.md", 50), ("workbench.md", 40)])
def test_doc_session(page, minimum):
    result = doctest.testfile(str(DOCS / page), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > minimum
    assert result.failed == 0


def _console_blocks(text: str):
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        command, _, expected = block.partition("\n")
        if command.startswith("$ cute-kernels "):
            yield command[2:], expected.rstrip("\n")


def test_workbench_console_blocks_are_what_the_commands_print(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # commands that write files write them here
    blocks = list(_console_blocks((DOCS / "workbench.md").read_text()))
    assert len(blocks) >= 6
    for command, expected in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(shlex.split(command)[1:]) == 0, command
        printed = out.getvalue().rstrip("\n")
        if expected.endswith("\n..."):  # the page shows the first lines only
            assert printed.startswith(expected[: -len("\n...")]), command
        else:
            assert printed == expected, command
    assert os.path.exists(tmp_path / "sw128.html")
