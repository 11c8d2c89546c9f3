"""The scripted demo: one chat turn, the article's prompt-length series, then two
concurrent synthetic prompts.

`kvscope --screenshot` passes it to `run_tui` as the app's start-up script, to make a
picture of the app doing its job: a finished reply with its footer, the latency plot with
TTFT rising and ITL flat over 512-4,096 tokens, and the KV block map with two requests in
it (the picture is taken while both are still streaming).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from textual.widgets import Input

if TYPE_CHECKING:
    from collections.abc import Callable

    from tui.app import KvscopeApp

LOAD_TIMEOUT_S = 900.0  # a real model on a CPU can take minutes to load
REPLY_TIMEOUT_S = 300.0
SERIES = (512, 1024, 2048, 4096)
SERIES_MAX_TOKENS = 32


async def _wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def run_demo(app: KvscopeApp) -> None:
    main = app.main_screen
    ok = await _wait_for(lambda: main.engine_state != "loading", LOAD_TIMEOUT_S)
    ok = ok and main.engine_state == "ready"
    if ok:
        ok = await _demo_requests(app)
    await main.redraw()
    await asyncio.sleep(0.2)  # let the compositor paint what the redraw changed
    if app.screenshot_path:
        app.save_screenshot(filename=app.screenshot_path)
        app.exit(0 if ok else 1)


async def _demo_requests(app: KvscopeApp) -> bool:
    main = app.main_screen
    card = main.card
    assert card is not None
    await main.send("What does the KV cache hold, and why does it grow?", synthetic=False)
    if not await _wait_for(lambda: not main.busy, REPLY_TIMEOUT_S):
        return False

    controls = main.controls
    # The article's series, sent as a presenter would: slider, then Enter. Lengths past
    # a wall (with room for the output) are left out rather than shown failing.
    fits = min(card.max_model_len - 1, card.kv_pool_tokens) - SERIES_MAX_TOKENS
    max_tokens = controls.query_one("#max-tokens", Input)
    max_tokens.value = str(SERIES_MAX_TOKENS)
    controls.synthetic = True
    for n in (n for n in SERIES if n <= fits):
        controls.slider.value = n
        await asyncio.sleep(0)
        if not await main.send("", synthetic=True):
            return False
        if not await _wait_for(lambda: not main.busy, REPLY_TIMEOUT_S):
            return False
    max_tokens.value = "128"
    controls.concurrency = 2
    # Comfortably under both walls, so both copies are admitted and hold many blocks.
    wall = min(card.max_model_len, card.kv_pool_tokens // 2)
    controls.slider.value = max(
        controls.slider.minimum, int(wall * 0.6) // card.block_size * card.block_size
    )
    controls.synthetic = True
    await main.send("Now answer after this long prompt.", synthetic=True)
    reply = main.current
    if reply is None:
        return False
    # Take the picture while both copies stream, so the block map shows both.
    return await _wait_for(
        lambda: all(c.received >= 6 or c.done for c in reply.copies), REPLY_TIMEOUT_S
    )
