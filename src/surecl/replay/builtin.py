"""The built-in replay policies, as (name, ``"module:Class"``) pairs that :mod:`surecl.registry`
reads (each class imported on first use). Plain data: this module imports nothing."""

POLICIES = (
    ("none", "surecl.replay.policies:NoReplay"),
    ("reservoir", "surecl.replay.policies:ReservoirPolicy"),
    ("random", "surecl.replay.policies:RandomPolicy"),
    ("surprise", "surecl.plugins.sure:SurprisePolicy"),
    ("online_surprise", "surecl.plugins.sure:OnlineSurprisePolicy"),
)
