"""One pilot test on the real CPU engine: the session's shared vLLM engine drives the app."""

from __future__ import annotations

from textual.widgets import Input
from tui_helpers import engine_ready, make_app, reply_done, send_chat


async def test_a_short_reply_streams_and_the_kv_panel_moves(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    app = make_app(engine=vllm_engine)
    async with app.run_test(size=(160, 48)) as pilot:
        await engine_ready(pilot, timeout=120)
        main = app.main_screen
        card = vllm_engine.card
        assert main.engine_state == "ready"
        main.controls.query_one("#max-tokens", Input).value = "12"
        await send_chat(pilot, "Name one colour.")
        await reply_done(pilot, timeout=120)
        reply = main.current
        assert reply is not None
        assert reply.text.strip()
        transcript = main.chat.transcript_text()
        assert "TTFT" in transcript
        assert "tok/s" in transcript
        telemetry = app.telemetry
        assert len(telemetry.points) == 1
        # The KV panel moved: usage rose above zero while the reply held blocks.
        assert max(telemetry.kv_pct) > 0
        assert telemetry.latest is not None
        assert telemetry.latest.total_blocks == card.total_blocks
        assert telemetry.latest.block_size == card.block_size
