"""The simulator's engine with finishes discovered by sampling instead of known in advance.

The sampler runs the SAME policy objects as the simulator (``simulate.make_policy``): they decide
admissions, preemptions and releases through the engine's interface; the sampler executes one real
decode step at a time and tells the engine which completions ended. With forced lengths (trace
replay) the engine knows the lengths up front, exactly as in a simulation, so both produce the
same decisions at the same steps.
"""

from __future__ import annotations

import heapq

from simulate.engine import Engine

__all__ = ["LiveEngine"]


class LiveEngine(Engine):
    """An :class:`simulate.engine.Engine` stepped one decode step at a time by the sampler.

    ``lengths``: the forced lengths, or ``max_new_tokens`` for every completion (the latest a
    completion can end); :meth:`finish` moves a completion's end to the step it sampled a stop token.
    """

    def finish(self, job: int, step: int) -> None:
        """``job`` generated its last token at ``step`` (the step being completed)."""
        age = step - self.origin[job]
        if self.length[job] == age:
            return  # already scheduled (a forced length, or max_new_tokens)
        self.length[job] = age
        self._epoch[job] += 1
        heapq.heappush(self._heap, (step, job, self._epoch[job]))

    def step(self, pads: bool) -> None:
        """Advance one decode step: account memory, record finishes (see ``Engine._advance``)."""
        self._advance(self.t + 1, pads)
