"""The in-process engine: vLLM's LLMEngine stepped by one thread in kvscope's process.

`engine.py` is the step loop, `startup.py` turns vLLM's start-up failures into typed errors
and routes its logs, `options.py` is vLLM's own flags with kvscope's CPU defaults, and
`internals.py` is the one file that reads vLLM's scheduler and block pool.
"""
