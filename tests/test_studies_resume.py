"""The committed studies resume: every finished run under ``studies/<name>/`` is the run its plan
(``studies/<name>.yaml``) asks for at that path, as ``surecl sweep`` checks before it skips a run,
and no finished run lies at a path the plan no longer names (but the documented ones).
A preset whose defaults change (O-LoRA's penalty form, Progressive Prompts' epochs) made
``surecl sweep --plan studies/smollm2.yaml`` stop at the first such run with "already holds a
finished run with a different config"; the plan now pins the settings those rows ran with, and
this test catches the next such change. It reads the plans and the committed results.json files
only (no data, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surecl.config import build_config, same_config
from surecl.sweep import expand, load_plan

STUDIES = Path(__file__).resolve().parents[1] / "studies"
PLANS = sorted(p.stem for p in STUDIES.glob("*.yaml") if (STUDIES / p.stem).is_dir())
OUTSIDE_THE_PLAN = {
    # RESULTS.md §6: `replay.buffer_size=1.0` once read as a count of one example; the plan now
    # asks for replay.buffer_fraction=1.0, and the run stays as the record of that mistake
    "smollm2": {"surprise/replay.buffer_size=1.0/order-s1/seed0"},
}
"""Finished runs a study keeps at a path its plan no longer names, each for a documented reason;
any other such run is a plan edit that renamed its path (the sweep would train it again)."""


def test_the_studies_are_found():
    assert {"smollm2", "faithful", "gpu-lnt"} <= set(PLANS)


@pytest.mark.parametrize("name", PLANS)
def test_every_finished_run_of_a_study_is_its_plans_run(name):
    plan = load_plan(str(STUDIES / f"{name}.yaml"))
    checked, differ = 0, []
    for r in expand(plan):
        path = STUDIES / name / r.path / "results.json"
        if not path.is_file():
            continue
        cfg = build_config(f"{plan.config},{r.method}" if plan.config else r.method, r.overrides)
        checked += 1
        if not same_config(json.loads(path.read_text(encoding="utf-8"))["config"], cfg):
            differ.append(r.path)
    assert not differ, f"{name}: {len(differ)} of {checked} finished runs are not their plan's run: {differ[:5]}"
    finished = {str(p.parent.relative_to(STUDIES / name)) for p in (STUDIES / name).rglob("results.json")
                if "report" not in p.relative_to(STUDIES / name).parts}
    outside = finished - {str(Path(r.path)) for r in expand(plan)}
    assert outside == OUTSIDE_THE_PLAN.get(name, set()), f"{name}: finished runs at paths its plan does not name: {sorted(outside)[:5]}"
