"""A two-process run with a probe (``tests/test_process_agreement.py``): each process writes
what it holds to ``$PROBE_DIR/rank<r>.json``: a digest of the fast adapter after each task's
``before_task`` and at its end, and digests of the first dropout masks it drew.

Usage: ``python process_probe.py OUT PRESET [overrides...]``; with ``PROBE_API=1`` the run is
started through :func:`surecl.trainer.run` (the Python API) and a :class:`SureclError` is
printed as ``surecl: <message>`` with exit code 2, as the command line does."""

import hashlib
import json
import os
import sys
from pathlib import Path

import surecl.adapters as adapters
from surecl.config import build_config
from surecl.errors import SureclError
from surecl.plugins.base import Plugin
from surecl.trainer import ContinualRun, run

record = {"before": [], "end": [], "masks": []}
_keep_mask = adapters.keep_mask


def spied_mask(shape, dropped):
    mask = _keep_mask(shape, dropped)
    if len(record["masks"]) < 8:
        record["masks"].append(hashlib.sha256(mask.numpy().tobytes()).hexdigest()[:16])
    return mask


adapters.keep_mask = spied_mask


def digest(ctx) -> str:
    h = hashlib.sha256()
    for p in ctx.adapters.fast_params:
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()[:16]


class Probe(Plugin):
    name = "probe"

    def before_task(self, ctx, stage):  # after the method's before_task
        record["before"].append(digest(ctx))

    def after_task(self, ctx, stage):
        record["end"].append(digest(ctx))


out, preset, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
cfg = build_config(preset, overrides)
cache = Path(os.environ["SURECL_CACHE"])
try:
    if os.environ.get("PROBE_API"):
        run(cfg, out, progress=False, cache_dir=cache)
        rank = int(os.environ.get("RANK", "0"))
    else:
        r = ContinualRun(cfg, out, progress=False, cache_dir=cache, plugins=[Probe()])
        r.run()
        rank = r.rank
except SureclError as e:
    print(f"surecl: {e}", file=sys.stderr)
    sys.exit(2)
(Path(os.environ["PROBE_DIR"]) / f"rank{rank}.json").write_text(json.dumps(record))
