# SPDX-License-Identifier: MIT
"""Every ```python block of docs/python.md and of the README's Python section, run as
written, each in a namespace of its own (those that import torch only where it is
installed)."""
import importlib.util
import pathlib
import re
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def blocks(path, section=None):
    text = (ROOT / path).read_text()
    if section is not None:  # from the heading to the next one of its level or above
        start = text.index(section)
        level = section.split(" ")[0]
        end = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(section):], re.M)
        text = text[start:start + len(section) + end.start()] if end else text[start:]
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


CASES = [("docs/python.md", i, code) for i, code in enumerate(blocks("docs/python.md"))] + \
    [("README.md", i, code) for i, code in enumerate(blocks("README.md", "### From Python"))]


def test_found():
    """The pages have the examples this test runs (a renamed heading would skip them)."""
    assert sum(1 for c in CASES if c[0] == "docs/python.md") >= 5
    assert sum(1 for c in CASES if c[0] == "README.md") >= 2


@pytest.mark.parametrize("page, index, code", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_example(page, index, code):
    if re.search(r"^import torch|^from torch", code, re.M) and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    if re.search(r"^import numpy", code, re.M) and importlib.util.find_spec("numpy") is None:
        pytest.skip("numpy is not installed")
    # a module of its own in sys.modules: torch.compile looks a function's module up by name
    name = f"flashattn_example_{re.sub(r'[^A-Za-z0-9]', '_', page)}_{index}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(code, f"{page} example {index}", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
