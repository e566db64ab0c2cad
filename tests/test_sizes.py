"""Size limits of issue 26: no module over 800 lines, no function body over 80 lines, checked
for the packages already within them (others join this list as they are brought within)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ckptstore"
WITHIN_LIMITS = ("experiment", "core")
MAX_MODULE_LINES = 800
MAX_BODY_LINES = 80


def _modules():
    return sorted(p for name in WITHIN_LIMITS for p in (PACKAGE / name).rglob("*.py"))


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its docstring left out."""
    body = node.body
    first = body[0]
    is_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant)
    if is_doc and isinstance(first.value.value, str) and len(body) > 1:
        first = body[1]
    return node.end_lineno - first.lineno + 1


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_and_function_sizes(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = [
        f"{node.name} (line {node.lineno}): {_body_lines(node)} lines"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _body_lines(node) > MAX_BODY_LINES
    ]
    assert long == []


def test_the_limit_check_finds_a_long_function():
    source = "def f():\n    '''doc'''\n" + "    x = 1\n" * (MAX_BODY_LINES + 1)
    (node,) = ast.parse(source).body
    assert _body_lines(node) == MAX_BODY_LINES + 1
