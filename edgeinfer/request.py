"""The one internal chat request: what every dialect translates its body into, in no API's shape.

Chat completions, Responses, Messages, /apply-template, count_tokens and `edgeinfer chat` each
validate their own input and build a ChatInput; edgeinfer/prepare.py makes it ready for the engine and
server/run.py answers it; neither imports a wire schema.
Everything here is already checked: roles are the four the templates know, arguments are objects,
the tools have unique names and a forced tool is among them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from edgeinfer.formats.base import ToolSpec
from edgeinfer.options import Grammar, SamplingParams

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class PastCall:
    """A call the assistant made earlier in the conversation."""

    id: str
    name: str
    arguments: Any  # the JSON value the client sent (an object, as every API's schema asks)


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of the conversation."""

    role: Role
    text: str = ""
    calls: tuple[PastCall, ...] = ()  # an assistant's calls
    call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None  # a tool result: the function, where the client said


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema; None: any object
    origin: str = "tools"  # where the client sent its schema, for errors (tools[0].function.parameters)
    strict: bool | None = None  # as the client sent it: templates that print a tool whole print it too

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters or {"type": "object"})

    def as_template_takes_it(self) -> dict[str, Any]:
        """The tool as chat templates read it (the shape Hugging Face's templates were written for)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


@dataclass(slots=True)
class ChatInput:
    model: str
    turns: list[Turn]
    sampling: SamplingParams  # max_tokens, stop, logprobs..., without the grammar run.prepare builds
    named: frozenset[str] = frozenset()  # the sampling fields the client set (the model's defaults fill the rest)
    tools: list[Tool] = field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] = "auto"
    forced: str | None = None  # the one tool the answer must call (tool_choice naming a function)
    parallel_calls: bool = False
    answer_format: Grammar | None = None  # the answer's JSON Schema when there is no call (response_format)
    grammar: Grammar | None = None  # a client's own grammar (edgeinfer's Lark `grammar` field)
    reasoning_budget: int | None = None  # thinking tokens at most; None: the server's --reasoning-budget
    n: int = 1

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def has_tool_history(self) -> bool:
        """Earlier calls or their results are in the conversation (the template then matters even without tools)."""
        return any(t.calls or t.role == "tool" for t in self.turns)
