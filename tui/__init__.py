"""kvscope's Textual app. Nothing here imports vLLM at module level."""
