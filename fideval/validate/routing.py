"""Routing fidelity (a candidate's ``routing: record | decompose``, docs/formats-routes.md) refused in seconds where
the stages would refuse it: a model without routed experts has no routes to record or force (the runner's own
refusal, in its words). Every build the runner computes (emulated, or a real checkpoint read in the reference's
layout) calls its routed experts through the same wrapper as the reference, so none is refused for its source; with
the reference code, every driven DeepSeek model routes (its gate's hook, fideval.model.reference.gate_routes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fideval.config import Config
    from fideval.validate.findings import Findings


def check(cfg: Config, probe: Any, found: Findings) -> None:
    asked = [(i, c) for i, c in enumerate(cfg.candidates) if c.routing != "off"]
    if not asked or cfg.model.implementation != "transformers" or probe.adapter is None:
        return  # the reference code's models all route; a model not yet local is checked when a stage has it
    if not probe.experts:
        i, c = asked[0]
        found.add(f"candidates[{i}].routing", f"candidate {c.name!r} asks for routing {c.routing!r}, but the model has no "
                  "routed experts: there are no routes to record or force", "set routing: off for a dense model")
