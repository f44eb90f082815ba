"""Fixed prompt sets for the benchmark. Each workload yields prompts for n streams."""

from __future__ import annotations

from edgeinfer.bench.battery import CASES
from edgeinfer.engine import Engine

CHAT = [
    "Write a short poem about the sea.",
    "Explain what a hash table is.",
    "Give three tips for learning to cook.",
    "What causes the seasons on Earth?",
    "Describe a cat to someone who has never seen one.",
    "List five uses for a paperclip.",
    "Why is the sky blue?",
    "Summarise the plot of a heist movie you invent.",
    "How do I make a cup of tea?",
    "What is the difference between weather and climate?",
    "Write a haiku about autumn.",
    "Explain recursion with an example.",
    "What should I pack for a weekend hike?",
    "Tell me a fun fact about octopuses.",
    "How does a bicycle stay upright?",
    "Suggest a name for a bakery and explain it.",
]

# Short factual questions, for comparisons where the answers matter (packed vs alone).
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Name three primary colours.",
    "Explain photosynthesis in one sentence.",
    "What is 12 times 12?",
    "Give me a tip for sleeping well.",
    "Who wrote Romeo and Juliet?",
    "Describe a sunset.",
    "List four animals that live in the sea.",
    "How do airplanes fly?",
    "What is a prime number?",
    "Suggest a name for a pet goldfish.",
    "Why do leaves change colour in autumn?",
    "Explain what a database index is.",
    "What is the boiling point of water?",
    "Write one sentence about the moon.",
]

# Code-edit: the model re-emits a file with one small change, as editing agents do.
# Most of the answer repeats the prompt, which is what n-gram drafting feeds on.
_FILES = [
    (
        "geometry.py",
        "area",
        "surface",
        '''import math


def area(radius):
    """Area of a circle."""
    return math.pi * radius * radius


def perimeter(radius):
    """Perimeter of a circle."""
    return 2 * math.pi * radius


def describe(radius):
    a = area(radius)
    p = perimeter(radius)
    return f"radius={radius} area={a:.2f} perimeter={p:.2f}"


if __name__ == "__main__":
    for r in (1, 2, 3):
        print(describe(r))
''',
    ),
    (
        "inventory.py",
        "total",
        "grand_total",
        '''from dataclasses import dataclass


@dataclass
class Item:
    name: str
    price: float
    quantity: int


def total(items):
    """Sum of price times quantity."""
    return sum(item.price * item.quantity for item in items)


def cheapest(items):
    return min(items, key=lambda item: item.price)


def report(items):
    lines = [f"{item.name}: {item.quantity} x {item.price}" for item in items]
    lines.append(f"total: {total(items)}")
    return "\\n".join(lines)
''',
    ),
]


def code_edit_prompt(i: int) -> str:
    name, old, new, body = _FILES[i % len(_FILES)]
    return f"Rename the function `{old}` to `{new}` in {name} and print the whole file:\n```python\n{body}```"


# Agent: one long shared system prompt of tool definitions, a JSON tool call expected back.
_TOOLS = [
    ("read_file", "Read a file from the workspace; returns its text.", '{"path": "string"}'),
    ("write_file", "Replace a file's text in the workspace.", '{"path": "string", "text": "string"}'),
    ("list_dir", "List a directory of the workspace.", '{"path": "string"}'),
    ("run_tests", "Run the test suite; returns the summary line.", '{"pattern": "string"}'),
    ("search", "Search the workspace for a regular expression.", '{"regex": "string"}'),
    ("git_diff", "Show the uncommitted changes.", "{}"),
]


def agent_tools() -> list[dict[str, object]]:
    """The agent's tools as OpenAI tool definitions (every argument a required string)."""
    import json

    out: list[dict[str, object]] = []
    for name, doc, args in _TOOLS:
        props = {key: {"type": "string", "maxLength": 200} for key in json.loads(args)}
        params = {"type": "object", "properties": props, "required": list(props)}
        out.append({"type": "function", "function": {"name": name, "description": doc, "parameters": params}})
    return out


AGENT_SYSTEM = (
    "You are a coding agent working in a repository. Answer every request with exactly one tool call "
    'as JSON: {"tool": NAME, "arguments": {...}}. Tools:\n'
    + "".join(f"- {name}: {doc} Arguments: {args}\n" for name, doc, args in _TOOLS)
    * 4
)
AGENT_TASKS = [
    "Open the README.",
    "Find where the scheduler admits requests.",
    "Run the tests for the server.",
    "Show me what changed.",
    "List the scripts folder.",
    "Search for TODO comments.",
]
# The turn before each task: the agent looked around first, and the tool answered.
_FIRST_CALL = '{"tool": "list_dir", "arguments": {"path": "."}}'
_FIRST_RESULT = "Tool result: README.md, Makefile, pyproject.toml, edgeinfer/, scripts/, tests/"


def agent_conversation(i: int, tag: str = "", head: str = "") -> list[dict[str, str]]:
    """Multi-turn: system prompt, a first request, the agent's tool call and its result, then task i."""
    return [
        {"role": "system", "content": f"{head}{AGENT_SYSTEM}"},
        {"role": "user", "content": f"{tag}Look at the repository."},
        {"role": "assistant", "content": _FIRST_CALL},
        {"role": "user", "content": f"{_FIRST_RESULT}\n\n{AGENT_TASKS[i % len(AGENT_TASKS)]}"},
    ]


# Multi-agent: many agents, each with its own long history (nothing shared but the chat template),
# coming back for a new turn: the distinct-context case, where each stream should pay for its own
# context only.
_PROJECTS = ["billing", "search", "payments", "auth", "reports", "mailer", "scheduler", "uploads"]


def _log(i: int, turn: int) -> str:
    """A tool result of about 190 tokens, different for every agent and turn."""
    lines = [
        f"{name}.py:{10 * k + turn + i % 7}: {verb} {obj} ({k + i} ms)"
        for k, (name, verb, obj) in enumerate(
            [
                ("handlers", "called", "parse_request"),
                ("models", "loaded", f"table_{i}_{turn}"),
                ("views", "rendered", "index"),
                ("cache", "missed", f"key:{i * 31 + turn}"),
                ("worker", "queued", f"job-{i}-{turn}"),
                ("db", "committed", "transaction"),
                ("api", "returned", "200 OK"),
                ("tests", "passed", f"{20 + i + turn} checks"),
            ]
        )
    ]
    return "Tool result:\n" + "\n".join(lines)


def multi_agent_conversation(i: int, tag: str = "", head: str = "") -> list[dict[str, str]]:
    """Agent i: its own system prompt and four earlier tool turns (about 1,000 tokens), then a new task."""
    project = _PROJECTS[i % len(_PROJECTS)]
    tools = _TOOLS[i % len(_TOOLS) :] + _TOOLS[: i % len(_TOOLS)]
    system = (
        f"{head}You are agent {i}, maintaining the {project} service (instance {i}). Answer every request with "
        'exactly one tool call as JSON: {"tool": NAME, "arguments": {...}}. Tools:\n'
        + "".join(f"- {name}: {doc} Arguments: {args}\n" for name, doc, args in tools)
    )
    conv = [{"role": "system", "content": system}]
    for turn in range(4):
        path = f"{project}/module_{i}_{turn}.py"
        conv.append({"role": "user", "content": f"Step {turn + 1} of the {project} investigation: check {path}."})
        conv.append({"role": "assistant", "content": f'{{"tool": "read_file", "arguments": {{"path": "{path}"}}}}'})
        conv.append({"role": "user", "content": _log(i, turn)})
    conv[-1]["content"] += f"\n\n{tag}{AGENT_TASKS[i % len(AGENT_TASKS)]}"
    return conv


# Long prefill: a long document and a one-line question.
_DOC = " ".join(
    f"Section {i}: the committee met on day {i} and agreed on item {i * 7 % 23}, with {i % 5} objections noted."
    for i in range(1, 60)
)


WORKLOADS = ("chat", "code-edit", "agent", "multi-agent", "long-prefill", "json")


def messages(workload: str, n: int, tag: str = "", head: str = "") -> list[list[dict[str, str]]]:
    """Chat messages for n streams of a workload.

    `head` opens the first message, so nothing cached before matches (a cold prefix);
    `tag` goes just before the part that differs per stream, so a shared prefix such as
    the agent's system prompt stays reusable (a warm prefix) while the request is new.
    """
    if workload == "chat":
        return [[{"role": "user", "content": f"{head}{tag}{CHAT[i % len(CHAT)]}"}] for i in range(n)]
    if workload == "code-edit":
        return [[{"role": "user", "content": f"{head}{tag}{code_edit_prompt(i)}"}] for i in range(n)]
    if workload == "agent":
        return [agent_conversation(i, tag, head) for i in range(n)]
    if workload == "multi-agent":
        return [multi_agent_conversation(i, tag, head) for i in range(n)]
    if workload == "long-prefill":
        ask = "In one sentence: on which day was item {} agreed?"
        return [[{"role": "user", "content": f"{head}{_DOC}\n\n{tag}{ask.format(i % 23)}"}] for i in range(n)]
    if workload == "json":  # bench/jsonload.py: every other stream answers a battery schema
        return [[{"role": "user", "content": f"{head}{tag}{json_prompt(i)}"}] for i in range(n)]
    raise ValueError(f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")


def json_prompt(i: int) -> str:
    """Stream i of the json workload: a battery schema's prompt (even i) or a chat prompt (odd i)."""
    if i % 2:
        return CHAT[i // 2 % len(CHAT)]
    return CASES[i // 2 % len(CASES)].prompt + " Answer in JSON."


# Tokens generated per stream unless --max-tokens says otherwise: what each workload's answers need.
MAX_TOKENS = {"chat": 128, "code-edit": 256, "agent": 64, "multi-agent": 48, "long-prefill": 32, "json": 256}


def prompts(engine: Engine, workload: str, n: int, tag: str = "") -> list[list[int]]:
    """The same as token prompts, through the engine's chat template."""
    return [engine.chat_prompt(m) for m in messages(workload, n, tag)]
