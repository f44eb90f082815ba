"""Fixed prompt sets for the benchmark. Each workload yields prompts for n streams."""

from __future__ import annotations

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


WORKLOADS = ("chat", "code-edit")


def prompts(engine: Engine, workload: str, n: int, tag: str = "") -> list[list[int]]:
    """Token prompts for n streams of a workload; a tag makes them new (no reuse across runs)."""
    if workload == "chat":
        return [engine.chat_prompt([{"role": "user", "content": f"{tag}{CHAT[i % len(CHAT)]}"}]) for i in range(n)]
    if workload == "code-edit":
        return [engine.chat_prompt([{"role": "user", "content": f"{tag}{code_edit_prompt(i)}"}]) for i in range(n)]
    raise ValueError(f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")
