"""An engine that dies tells every live request why, and can be started again in-process."""

from __future__ import annotations

import pytest
from subprocess_report import run_and_report

pytestmark = pytest.mark.engine

SCRIPT = """
import asyncio, json
from engine.errors import EngineDied
from engine.events import GenerationRequest, SamplingSettings, RequestFinished
from engine.vllm.engine import VllmEngine

ARGV = ['--max-model-len', '1024', '--kv-cache-memory-bytes', str(32 * 1024**2)]
engine = VllmEngine(argv=ARGV)
engine.start()
report = {}

async def one(rid, n=8):
    last = None
    ids = engine.synthetic_prompt(64)
    sampling = SamplingSettings(max_tokens=n, ignore_eos=True)
    async for ev in engine.stream(GenerationRequest(rid, prompt_token_ids=ids, sampling=sampling)):
        last = ev
    return last

def die_soon(_engine):
    # On the step thread: die once the request below waits in the command queue, not yet
    # registered. Waited for, not slept on: a loaded machine may take a while to queue it.
    import time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with engine._commands.mutex:  # kvscope's own queue (_engine is vLLM's engine)
            if any(kind == 'add' for kind, _ in engine._commands.queue):
                report['queued_seen'] = True
                break
        time.sleep(0.01)
    raise RuntimeError('simulated fault before registration')

def boom(_engine):
    def step():
        raise RuntimeError('simulated device fault')
    _engine.step = step

async def main():
    report['before'] = (await one('before')).output_tokens
    engine._commands.put(('call', boom))
    try:
        await one('doomed')
        report['doomed'] = 'finished?!'
    except EngineDied as exc:
        report['doomed'] = exc.plain()
    try:
        await one('after-death')
        report['after'] = 'served?!'
    except EngineDied as exc:
        report['after'] = 'refused'

asyncio.run(main())
engine.start()   # restart in the same process
report['restarted'] = asyncio.run(one('again')).output_tokens

async def queued_behind_death():
    # The engine dies while this request waits in the command queue, before the step
    # thread registers it: the reply must still end, with the cause.
    engine.synthetic_prompt(64)  # warm the filler cache: stream() must enqueue at once
    engine._commands.put(('call', die_soon))
    try:
        await asyncio.wait_for(one('queued'), timeout=60)
        return 'finished?!'
    except EngineDied as exc:
        return exc.plain()
    except asyncio.TimeoutError:
        return 'hung'

report['queued'] = asyncio.run(queued_behind_death())
engine.shutdown()
print('REPORT' + json.dumps(report))
"""


def test_engine_death_is_reported_and_a_restart_works() -> None:
    report = run_and_report(SCRIPT, "REPORT")
    assert report["before"] == 8
    assert "simulated device fault" in report["doomed"]
    assert report["doomed"].startswith("The engine stopped: RuntimeError")
    assert report["after"] == "refused"
    assert report["restarted"] == 8
    assert report.get("queued_seen"), "the request never reached the command queue"
    assert "simulated fault before registration" in report["queued"]
