"""The roofline: hardware profiles, model geometries, TTFT/ITL floors and KV capacity on a
GPU, and the KV-pool emulation built on them. Imports no vLLM and no UI."""
