"""SFT data layer: conversation schema, readers, validators and chat-template renderers.

Records flow `normalize` (readers) -> `validate` (or `valid_conversations`
with a `PipelineReport`) -> a renderer (`render_qwen3`, `render_glm45`), which
returns token ids and a per-token loss mask ready for packing.
"""

from recipe_jax.data.chat_template import (
    POLICIES,
    RENDERERS,
    Rendered,
    render_glm45,
    render_qwen3,
    supervised_turns,
    template_text,
)
from recipe_jax.data.readers import RecordError, normalize
from recipe_jax.data.schema import ROLES, Conversation, Message, Role, ToolCall, split_inline_reasoning
from recipe_jax.data.errors import PipelineReport
from recipe_jax.data.validate import (
    REASONS,
    InvalidRecordError,
    check_reasoning_tags,
    check_role_transitions,
    check_supervised,
    check_tool_results,
    sft_example_fn,
    valid_conversations,
    validate,
)

__all__ = [
    "POLICIES", "REASONS", "RENDERERS", "ROLES",
    "Conversation", "PipelineReport", "InvalidRecordError", "Message", "RecordError", "Rendered", "Role",
    "ToolCall",
    "check_reasoning_tags", "check_role_transitions", "check_supervised", "check_tool_results",
    "normalize", "render_glm45", "render_qwen3", "sft_example_fn", "split_inline_reasoning",
    "supervised_turns",
    "template_text", "valid_conversations", "validate",
]
