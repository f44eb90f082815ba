"""No model-backed test compares generated text outside tests/gate.py: read from the tests' own source.

A test of the model tier that writes `assert a.text == b.text`, or `assert "Paris" in answer`,
passes on the machine it was written on and fails on a CPU that rounds one near-tie the other way
(docs/testing.md). This reads every test function of the model tier and fails on a comparison
(`==`, `!=`, `in`, `not in`, `startswith`, ...) that touches generated text: a field that holds
what a model wrote (`.text`, `.content`, `.token_ids`, `.arguments`, `["content"]`, a CLI's
`.stdout`, ...), or a name assigned from one. Such checks go through tests/gate.py, whose every
function says why its comparison holds on any CPU.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure

TESTS = Path(__file__).resolve().parent
# Fields that hold what a model wrote, in the engine's results and in every API's answers.
GENERATED = {
    "text",
    "content",
    "token_ids",
    "output_text",
    "thinking",
    "reasoning_content",
    "arguments",
    "partial_json",
    "input",
    "delta",
    "stdout",
}
WORD_METHODS = {"startswith", "endswith", "count", "find", "index", "rfind", "rindex"}
# Calls whose result is still (a piece of) their argument's text.
TRANSPARENT = {"loads", "join", "strip", "lstrip", "rstrip", "lower", "upper", "split", "splitlines", "casefold"}
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def generated(node: ast.AST, tainted: set[str]) -> bool:
    """Whether an expression is generated text, a piece of it, or a collection of such."""
    if isinstance(node, ast.Attribute):
        return node.attr in GENERATED
    if isinstance(node, ast.Subscript):  # a generated field, or an item or slice of generated text or texts
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value in GENERATED
        return generated(node.value, tainted)
    if isinstance(node, ast.Name):
        return node.id in tainted
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name not in TRANSPARENT:
            return False
        inner = [f.value] if isinstance(f, ast.Attribute) else []
        return any(generated(a, tainted) for a in [*inner, *node.args])
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return any(generated(e, tainted) for e in node.elts)
    if isinstance(node, ast.ListComp | ast.GeneratorExp | ast.SetComp):
        return generated(node.elt, tainted)
    if isinstance(node, ast.BoolOp):
        return any(generated(v, tainted) for v in node.values)
    if isinstance(node, ast.BinOp):
        return generated(node.left, tainted) or generated(node.right, tainted)
    if isinstance(node, ast.IfExp):
        return generated(node.body, tainted) or generated(node.orelse, tainted)
    if isinstance(node, ast.JoinedStr):
        return any(generated(v.value, tainted) for v in node.values if isinstance(v, ast.FormattedValue))
    return False


def trivial(node: ast.AST) -> bool:
    """An empty text or collection, None or a number: comparing to it says nothing of which words came."""
    if isinstance(node, ast.Constant):
        return node.value in ("", None) or (isinstance(node.value, int | float) and not isinstance(node.value, bool))
    if isinstance(node, ast.List | ast.Tuple):
        return not node.elts
    return isinstance(node, ast.Dict) and not node.keys


def names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for e in target.elts for n in names(e)]
    if isinstance(target, ast.Subscript):
        return names(target.value)
    return []


def comparisons_of_generated_text(fn: ast.AST) -> list[tuple[int, str]]:
    """(line, source) of each comparison in fn that touches generated text (an assert's message aside)."""
    tainted: set[str] = set()
    for _ in range(3):  # names assigned from names assigned from generated text
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and generated(node.value, tainted):
                tainted.update(n for t in node.targets for n in names(t))
            elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value and generated(node.value, tainted):
                tainted.update(names(node.target))
    messages = {id(x) for node in ast.walk(fn) if isinstance(node, ast.Assert) and node.msg for x in ast.walk(node.msg)}
    found = []
    for node in ast.walk(fn):
        if id(node) in messages:
            continue
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops):
            parts = [node.left, *node.comparators]
            if any(generated(p, tainted) for p in parts) and not any(trivial(p) for p in parts):
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WORD_METHODS
            and generated(node.func.value, tainted)
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def tier(decorators: list[ast.expr], default: str) -> str:
    marks = [ast.unparse(d) for d in decorators]
    return "model" if "pytest.mark.model" in marks else "pure" if "pytest.mark.pure" in marks else default


def module_tier(tree: ast.Module) -> str:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return "model" if "model" in ast.unparse(node.value) else "pure"
    return "pure"


def model_tier_comparisons(source: str) -> list[tuple[str, int, str]]:
    """(test, line, source) of every comparison of generated text in a module's model-tier tests."""
    tree = ast.parse(source)
    default = module_tier(tree)
    found = []
    for node in ast.walk(tree):
        test = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
        if test and tier(node.decorator_list, default) == "model":
            found += [(node.name, line, text) for line, text in comparisons_of_generated_text(node)]
    return found


def test_no_model_tier_test_compares_generated_text_outside_the_gate():
    found = [
        f"{path.name}:{line} {test}: {text}"
        for path in sorted(TESTS.glob("test_*.py"))
        for test, line, text in model_tier_comparisons(path.read_text())
    ]
    assert found == [], "compare generated text through tests/gate.py (docs/testing.md):\n" + "\n".join(found)


PLANTED = """
import pytest
pytestmark = pytest.mark.model

def test_planted(oai, engine):
    r = oai.chat.completions.create(model="default", messages=[])
    whole = oai.chat.completions.create(model="default", messages=[])
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == whole.choices[0].message.content          # two requests compared
    assert "Paris" in r.choices[0].message.content                # a word asserted
    answer = r.choices[0].message.content.strip()
    assert answer.startswith("The capital")                      # through a name
    assert engine.generate([1]).token_ids == engine.generate([1]).token_ids
    assert r.choices[0].message.content and r.usage.completion_tokens > 0   # fine: no comparison of words
    assert r.choices[0].finish_reason == "stop"                  # fine: not generated text
    assert len(answer) == 12                                     # fine: a length

@pytest.mark.pure
def test_scripted(fake):
    assert fake.text == "scripted"                               # fine: the pure tier scripts its text
"""


def test_the_check_catches_planted_comparisons():
    found = model_tier_comparisons(PLANTED)
    assert [(test, line) for test, line, _ in found] == [
        ("test_planted", 9),
        ("test_planted", 10),
        ("test_planted", 12),
        ("test_planted", 13),
    ], found
