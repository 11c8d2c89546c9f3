"""The chat history that is sent with every chat turn.

Kept apart from the widgets so that what the model is sent is plain data a test can read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import ChatMessage


@dataclass
class Conversation:
    """Turns the model has seen; synthetic-prompt turns are not part of it (their filler
    is thousands of meaningless tokens that would swamp the next chat turn)."""

    messages: list[ChatMessage] = field(default_factory=list)
    turns: int = 0

    def next_turn(self) -> int:
        self.turns += 1
        return self.turns

    def request_messages(self, user_text: str) -> tuple[ChatMessage, ...]:
        """What to send for a new user message: the history, then the message."""
        return (*self.messages, ChatMessage("user", user_text))

    def record(self, user_text: str, reply_text: str) -> None:
        """Keep a finished (or stopped) exchange, so the next turn sees it."""
        self.messages.append(ChatMessage("user", user_text))
        self.messages.append(ChatMessage("assistant", reply_text))

    def clear(self) -> None:
        self.messages.clear()
