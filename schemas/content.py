"""The content model: messages made of typed content blocks (docs/architecture.md).

Every block is a frozen pydantic model discriminated on ``type``; a message
is a role plus a list of blocks. These are the only shapes that cross a
process boundary, always as JSON.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class Frozen(BaseModel):
    """Base for wire models: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"


class TextBlock(Frozen):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(Frozen):
    type: Literal["thinking"] = "thinking"
    thinking: str


class ToolCallBlock(Frozen):
    type: Literal["tool_call"] = "tool_call"
    tool_request_id: str
    tool: str
    params: dict[str, Any]


class ToolResultBlock(Frozen):
    type: Literal["tool_result"] = "tool_result"
    tool_request_id: str
    tool: str
    result: Any
    is_error: bool = False


class RawBlock(Frozen):
    """Provider-specific content kept verbatim (``model_kind`` names the provider)."""

    type: Literal["raw"] = "raw"
    model_kind: str
    data: Any


ContentBlock = Annotated[
    TextBlock | ThinkingBlock | ToolCallBlock | ToolResultBlock | RawBlock,
    Field(discriminator="type"),
]

content_blocks_adapter: TypeAdapter[list[ContentBlock]] = TypeAdapter(list[ContentBlock])


class Usage(Frozen):
    """Tokens and cost of one model call (or a sum of them)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )


class Message(Frozen):
    role: Role
    content: list[ContentBlock]
    usage: Usage | None = None

    @property
    def text(self) -> str:
        """The concatenated text blocks of the message."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_calls(self) -> list[ToolCallBlock]:
        return [b for b in self.content if isinstance(b, ToolCallBlock)]
