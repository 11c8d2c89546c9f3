"""The in-process engine's life cycle: what happens around shutdown()."""

from __future__ import annotations

import pytest
from subprocess_report import run_and_report

from engine.errors import EngineDied
from engine.vllm.engine import VllmEngine


def test_a_start_after_shutdown_refuses_without_building() -> None:
    # The app quit before its worker got round to start(): nothing may load after that.
    engine = VllmEngine(argv=["--model", "/no/such/model"])
    engine.shutdown()
    with pytest.raises(EngineDied, match="shut down"):
        engine.start()
    assert engine._thread is None


# Two shutdowns race from two threads while a reply streams (the app's quit and its
# engine worker both stop the engine), then the caller stops it once more.
SHUTDOWN_TWICE = """
import asyncio, gc, json, threading, time, weakref
from engine.errors import EngineDied
from engine.events import GenerationRequest, SamplingSettings, TokenEvent
from engine.vllm.engine import VllmEngine

engine = VllmEngine(argv=['--max-model-len', '1024', '--kv-cache-memory-bytes', str(32 * 1024**2)])
engine.start()
core = weakref.ref(engine.introspection.core)
report = {'raised': []}

def stop():
    try:
        engine.shutdown()
    except BaseException as exc:
        report['raised'].append(repr(exc))

stoppers = [threading.Thread(target=stop) for _ in range(2)]

async def reply():
    sampling = SamplingSettings(max_tokens=900, ignore_eos=True)
    request = GenerationRequest('long', prompt_token_ids=engine.synthetic_prompt(64),
                                sampling=sampling)
    tokens = 0
    try:
        async for event in engine.stream(request):
            if isinstance(event, TokenEvent):
                tokens += 1
                if tokens == 2:
                    report['stop_began'] = time.monotonic()
                    for t in stoppers:
                        t.start()
        report['reply'] = 'finished?!'
    except EngineDied as exc:
        report['reply'] = exc.plain()
    report['tokens'] = tokens

asyncio.run(asyncio.wait_for(reply(), timeout=120))
for t in stoppers:
    t.join(timeout=60)
report['stoppers_returned'] = not any(t.is_alive() for t in stoppers)
report['first_s'] = time.monotonic() - report['stop_began']
started = time.monotonic()
stop()
report['third_s'] = time.monotonic() - started
try:
    engine.start()
    report['restart'] = 'started?!'
except EngineDied as exc:
    report['restart'] = exc.plain()
report['step_threads'] = [t.name for t in threading.enumerate() if t.name == 'kvscope-engine']
# vLLM's engine core (on a GPU: the weights and the KV pool) is freed by the shutdown,
# and a second engine in this process (Ctrl+R after a failure) is the only one alive.
gc.collect()
report['core_freed'] = core() is None
again = VllmEngine(argv=['--max-model-len', '1024', '--kv-cache-memory-bytes', str(32 * 1024**2)])
again.start()
gc.collect()
report['first_freed_after_restart'] = core() is None
second = weakref.ref(again.introspection.core)
again.shutdown()
gc.collect()
report['second_freed'] = second() is None
print('REPORT' + json.dumps(report))
"""


@pytest.mark.engine
def test_shutdown_is_safe_twice_from_two_threads_mid_reply_and_for_good() -> None:
    report = run_and_report(SHUTDOWN_TWICE, "REPORT")
    assert report["raised"] == []
    assert report["stoppers_returned"]
    # The live reply ends with the reason, not silently and not with its 900 tokens.
    assert report["reply"].startswith("The engine stopped: the engine was shut down"), report
    assert 2 <= report["tokens"] < 900
    # Nothing left to stop: it returns at once, a small part of what the real stop took
    # (a ratio in the same run, on any machine).
    assert report["third_s"] < report["first_s"] / 10, report
    assert "shut down" in report["restart"]
    assert report["step_threads"] == []  # an interpreter exit under it would abort (134)
    assert report["core_freed"], report
    assert report["first_freed_after_restart"], report
    assert report["second_freed"], report
