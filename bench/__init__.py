"""`kvscope bench`'s sweep: prompt lengths × runs against any Engine, with vllm-bench field
names. Imports no vLLM and no UI; the CLI and the sweep screen both drive it."""
