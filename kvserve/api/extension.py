"""kvserve's vendor extension: the `kvserve` object a request may carry (docs/agent.md).

Every other wire model accepts unknown fields, as the official APIs' clients expect; this one is
ours, so it is strict: an unknown key or a wrong type is a 400 in the protocol's error shape
rather than a hint silently dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvserve.chat.conversation import ServerHints

# Checkpoint names travel into logs; keep them short and printable.
SESSION_ID_PATTERN = r"^[\x21-\x7e][\x20-\x7e]{0,255}$"


class KvserveExtension(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)  # names the session in the log
    checkpoint: Literal["agent_session"] | None = None  # save prompt + reply when it finishes
    system_checkpoint: Literal["agent_system"] | None = None  # save the system prompt + tools prefix
    prefill_progress: bool = False  # `: prefill_progress {...}` SSE comments while the prompt prefills


def server_hints(extension: KvserveExtension | None) -> ServerHints:
    if extension is None:
        return ServerHints()
    return ServerHints(
        session_id=extension.session_id,
        save_session=extension.checkpoint is not None,
        save_system=extension.system_checkpoint is not None,
        prefill_progress=extension.prefill_progress,
    )
