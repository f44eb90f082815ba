"""Qwen3-Coder's calls: XML tags around each parameter, strings written raw, other values as JSON:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

The text carries no types, so reading a value back needs the tool's schema: a parameter whose
schema is a string is the text between the tags (less one newline each side, as the template
writes it); any other is JSON. The grammar holds each value to its own schema (a string is any
text without `</parameter>`, an enum one of its values, anything else llguidance's JSON for that
property's schema), with the required parameters present, in the order the schema lists them.
A string with a pattern, format or length is the exception: it is written as a JSON string,
which llguidance can hold to those, and read back from either form.
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.engine.grammar import JSON_OPTIONS, closed
from edgeinfer.formats.base import MAX_CALLS, Call, ToolFormat, ToolSpec, lark_str

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"
# Python's str() of the scalars the template writes into the history with `| string`.
PYTHON_SCALARS: dict[str, Any] = {"True": True, "False": False, "None": None}
STRING_LIMITS = {"pattern", "format", "minLength", "maxLength"}
CLOSE_VALUE = '"\\n</parameter>"'  # in Lark: the newline and closing tag after a value
# A string value and its closing tag: a lazy lexeme, it ends at the first closing tag. It holds none of the
# call's other tags: a small model writes `</function>\n</tool_call>` inside a value, then prose until
# max_tokens, believing the call closed. (A lexeme, not a stop string: what follows a stop string in its
# token would be lost to the next rule.)
TEXT_RULE = (
    "text[lazy]: /(?s:.*)<\\/parameter>/"
    " & ~/(?s:.*(<tool_call>|<\\/tool_call>|<function=|<\\/function>|<parameter=).*)/"
)


class Qwen3Coder(ToolFormat):
    name = "qwen3-coder"
    opening = OPEN
    markers = (OPEN, CLOSE)

    @classmethod
    def detect(cls, template: str) -> bool:
        # The parameter tag is the mark (Functionary's Llama template has `<function=` alone).
        return OPEN in template and FUNCTION in template and PARAMETER in template

    def write_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        schemas = {t.name: t.parameters for t in self.tools}
        return "\n".join(_write_call(name, args, _properties(schemas.get(name))) for name, args in calls)

    # --- the grammar -----------------------------------------------------------

    def grammar(self, tools: list[ToolSpec], required: bool, parallel: bool, answer: str) -> str:
        rules = [f"call: {' | '.join(f'tool{i}' for i in range(len(tools)))}"]
        for i, t in enumerate(tools):
            rules += _tool_rules(i, t, self.lit(f"{END_FUNCTION}\n", CLOSE))
        # After the first call's "<tool_call>" each further call opens on a new line, as the template writes them.
        # Each tag as `<[id]>` where the vocabulary holds it as one special token (Qwen3-Coder's), else as text.
        first = '"\\n" call more'
        again = self.lit("\n", OPEN, "\n")
        rules.append(f"more: ({again} call)~0..{MAX_CALLS - 1}" if parallel else 'more: ""')
        rules.append(TEXT_RULE)
        return "\n".join([self.start(first, required, answer), *rules]) + "\n"

    # --- the answer ------------------------------------------------------------

    def parse(self, text: str, final: bool) -> tuple[str | None, list[Call]]:
        # A call counts once its </function> is written, streaming or not; the closing tag is the grammar's.
        start = text.find(OPEN)
        if start < 0:
            return text, []
        schemas = {t.name: t.parameters for t in self.tools}
        calls = []
        pos = start
        while pos >= 0:
            found = _read_call(text, pos + len(OPEN))
            if found is None:
                break
            name, raw, end = found
            properties = _properties(schemas.get(name))
            args = {k: _value(v, properties.get(k)) for k, v in raw.items()}
            calls.append(Call(name, json.dumps(args, ensure_ascii=False)))
            pos = text.find(OPEN, end)
        if not calls:
            return text, []
        before = text[:start].strip()
        return before or None, calls


def _write_call(name: str, args: dict[str, Any], properties: dict[str, Any]) -> str:
    params = "".join(
        f"{PARAMETER}{k}>\n{_write_value(v, properties.get(k))}\n{END_PARAMETER}\n" for k, v in args.items()
    )
    return f"{OPEN}\n{FUNCTION}{name}>\n{params}{END_FUNCTION}\n{CLOSE}"


def _write_value(value: Any, schema: Any) -> str:
    """A string raw (unless its schema has it written as JSON), anything else as JSON."""
    if isinstance(value, str) and (schema is None or _raw_text(schema)):
        return value
    return json.dumps(value, ensure_ascii=False)


def _tool_rules(i: int, tool: ToolSpec, closing: str) -> list[str]:
    """tool{i}: the function tag, its parameters in the schema's order (the required ones always), the closing tags."""
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    required = set(params.get("required") or [])
    # Each property's schema keeps the definitions its references point to.
    defs: dict[str, Any] = {k: params[k] for k in ("$defs", "definitions") if k in params}
    rules, parts = [], []
    for j, (key, schema) in enumerate(_properties(params).items()):
        rule = f"tool{i}_p{j}"
        value = _value_rule(schema, defs)
        rules.append(f'{rule}: {lark_str(f"{PARAMETER}{key}>")} "\\n" {value} "\\n"')
        parts.append(rule if key in required else f"{rule}?")
    head = lark_str(f"{FUNCTION}{tool.name}>\n")
    return [f"tool{i}: {head} {' '.join(parts)} {closing}", *rules]


def _value_rule(schema: Any, defs: dict[str, Any]) -> str:
    """A parameter's value and closing tag in Lark: raw text for a string, its values for a string enum,
    JSON for the rest."""
    if _raw_text(schema):
        options = [schema["const"]] if "const" in schema else schema.get("enum")
        if isinstance(options, list) and options and all(isinstance(o, str) for o in options):
            return f"({' | '.join(lark_str(o) for o in options)}) {CLOSE_VALUE}"
        return "text"
    full = closed({**schema, **defs, "x-guidance": JSON_OPTIONS}) if isinstance(schema, dict) else schema
    return f"%json {json.dumps(full)} {CLOSE_VALUE}"


def _read_call(text: str, pos: int) -> tuple[str, dict[str, str], int] | None:
    """(name, raw parameter values, end) of the call written from pos (after the opening); None if not complete."""
    pos = _skip_space(text, pos)
    if not text.startswith(FUNCTION, pos):
        return None
    close = text.find(">", pos)
    if close < 0:
        return None
    name, pos = text[pos + len(FUNCTION) : close], close + 1
    raw: dict[str, str] = {}
    while True:
        pos = _skip_space(text, pos)
        if text.startswith(END_FUNCTION, pos):
            return name, raw, pos + len(END_FUNCTION)
        if not text.startswith(PARAMETER, pos):
            return None
        close = text.find(">", pos)
        end = text.find(END_PARAMETER, close)
        if close < 0 or end < 0:
            return None
        value = text[close + 1 : end]
        # The template writes a newline after the opening tag and before the closing one.
        value = value[1:] if value.startswith("\n") else value
        raw[text[pos + len(PARAMETER) : close]] = value[:-1] if value.endswith("\n") else value
        pos = end + len(END_PARAMETER)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _properties(params: Any) -> dict[str, Any]:
    props = params.get("properties") if isinstance(params, dict) else None
    return props if isinstance(props, dict) else {}


def _kinds(schema: Any) -> set[str]:
    """The JSON types a schema names at its top (empty when it names none)."""
    if not isinstance(schema, dict):
        return set()
    kinds = schema.get("type")
    if isinstance(kinds, str):
        return {kinds}
    if isinstance(kinds, list):
        return {k for k in kinds if isinstance(k, str)}
    options = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(options, list) and options and all(isinstance(o, str) for o in options):
        return {"string"}
    return set()


def _raw_text(schema: Any) -> bool:
    """Whether a parameter is written as raw text: a string (or null) whose text the grammar can hold to it.

    A string with a pattern, format or length is written as a JSON string instead, which llguidance holds
    to those (a raw-text grammar could not); the parser reads either."""
    kinds = _kinds(schema)
    return "string" in kinds and kinds <= {"string", "null"} and not STRING_LIMITS & schema.keys()


def _value(raw: str, schema: Any) -> Any:
    """A parameter's text as its schema's type: a string as written, anything else read as JSON.

    Text that is not JSON stays a string; Python's True, False and None (how the template writes
    such values into the history) read as JSON's."""
    kinds = _kinds(schema)
    if _raw_text(schema):
        return None if raw == "null" and "null" in kinds else raw
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return PYTHON_SCALARS.get(raw.strip(), raw)
    # A string written raw by a model left free (its grammar writes JSON) stays the text it is.
    return raw if kinds == {"string"} and not isinstance(value, str) else value
