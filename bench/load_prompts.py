"""The requests a load point sends: exact-length synthetic prompts that ignore EOS.

Lengths follow vLLM's random dataset (uniform around the asked length, `lengths_range`),
and every request gets a prompt of its own, drawn from the run's seed, so prefix caching
cannot help unless `shared_prefix` asks it to.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from engine.events import GenerationRequest, SamplingSettings

if TYPE_CHECKING:
    from bench.load_result import LoadConfig
    from engine.protocol import Engine


def lengths_range(n: int, ratio: float) -> tuple[int, int]:
    """vLLM's random dataset: lengths uniform in [n(1 - r), n(1 + r)], at least 1."""
    return max(int(n * (1 - ratio)), 1), int(n * (1 + ratio))


class PromptMaker:
    """The requests of one point, each its own seeded prompt (no shared prefix unless
    asked): seeds differ between runs because the run's seed does."""

    def __init__(self, engine: Engine, config: LoadConfig, point: int) -> None:
        self.engine, self.config, self.point = engine, config, point
        self._rng = random.Random(f"{config.seed}/{point}/lengths")
        self._prefix: tuple[int, ...] = ()
        if config.shared_prefix:
            longest = lengths_range(config.prompt_len, config.range_ratio)[1]
            ids = engine.synthetic_prompt(longest, seed=self._seed(-1))
            self._prefix = ids[: config.shared_prefix]

    def _seed(self, i: int) -> int:
        return (self.config.seed * 1_000_003 + self.point) * 1_000_033 + i

    def make(self, i: int, tag: str = "") -> GenerationRequest:
        c = self.config
        n = self._rng.randint(*lengths_range(c.prompt_len, c.range_ratio))
        out = self._rng.randint(*lengths_range(c.output_len, c.range_ratio))
        ids = self.engine.synthetic_prompt(n, seed=self._seed(i))
        if self._prefix:
            ids = self._prefix + ids[len(self._prefix) :]
        return GenerationRequest(
            f"load-{c.seed}-{self.point}{tag}-{i}",
            prompt_token_ids=ids,
            sampling=SamplingSettings(max_tokens=out, ignore_eos=True),
        )
