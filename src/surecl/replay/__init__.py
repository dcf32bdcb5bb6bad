"""Replay: buffers, selection policies and the surprise scorer.

``POLICIES`` are the built-in replay policies (:mod:`surecl.registry` reads them; each class is
imported on first use)."""

from surecl.registry import PolicySpec

POLICIES = (
    PolicySpec("none", "surecl.replay.policies:NoReplay"),
    PolicySpec("reservoir", "surecl.replay.policies:ReservoirPolicy"),
    PolicySpec("random", "surecl.replay.policies:RandomPolicy"),
    PolicySpec("surprise", "surecl.plugins.sure:SurprisePolicy"),
    PolicySpec("online_surprise", "surecl.plugins.sure:OnlineSurprisePolicy"),
)
