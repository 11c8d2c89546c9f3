"""The sweep (F5): one screen that measures TTFT and ITL over prompt lengths, or
throughput and latency over load levels, and exports what it measured.

`screen` is the screen (its layout, keys and mode, and the prompt-length mode);
`load_pane` is the load mode; `files` writes the exports and reads a saved sweep back;
`prompt_view_model` and `load_view_model` are the two modes as pure functions;
`load_results` is the load mode's plot and table; `overlay` draws a saved sweep over the
live one; `tapped_engine` reports each finished request as it ends.
"""
