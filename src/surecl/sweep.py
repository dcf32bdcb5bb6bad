"""Sweep plans: a study or an ablation as one YAML file, run with ``surecl sweep --plan``.

A plan names what ``surecl sweep`` would otherwise take from its options, plus what options
cannot say: orders given as explicit task lists (``data.tasks``), which benchmark an order
belongs to in the report, and groups of methods that run at different seeds::

    description: "..."
    config: paper-t5,lnt            # presets applied before each method preset
    overrides: [data.n_test=200]    # applied to every run
    orders: ["4", "5", "6"]         # or {s1: [dbpedia, amazon, agnews], ...}
    order_benchmark: {s1: Standard CL}
    seeds: [0, 1, 2]
    methods: [seq_lora, slow_surprise]
    grid: {replay.buffer_size: [150, 300, 500, 1500]}
    groups:                         # optional: each group overrides methods/seeds/orders/grid
      - {methods: [seq_lora, slow_surprise], seeds: [0, 1, 2]}
      - {methods: [random, ewc], seeds: [0]}
    claims: ["slow_surprise>seq_lora"]   # optional: the study's claims, beside the paper's

``claims`` names the study's own paired claims (``A>B``: row A better than row B, rows as
the report names them: ``"slow_surprise (fast)"``, ``"slow_surprise dual.beta=0.999"``). The
sweep checks that each names rows it plans, keeps them in ``sweep.json``, and every
``surecl report --layout paper`` of the folder tests them with the paper's claims, so the
study's claims table is one command without options.

Packaged plans (``surecl list``) reproduce the paper's tables; a path to a YAML file runs
your own. Options given on the command line (``--methods``, ``--orders``, ``--seeds``,
``--grid``, ``--config``) replace the plan's; ``--methods`` on a plan with groups picks those
methods' runs out of their groups (each keeps its group's seeds, orders, grid and overrides).
A plan that names no ``orders`` runs its protocol preset's (``lnt``: 4, 5, 6), as the command
line does without a plan. A grid value is one folder name (a ``/`` in it becomes ``_``); values
given as one text (``--grid key=v1,v2``) are split on the commas outside brackets and quotes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from surecl.config import safe_yaml, written
from surecl.errors import SureclError

PLAN_KEYS = {"description", "config", "overrides", "orders", "order_benchmark", "seeds", "methods", "grid", "groups", "layout",
             "claims"}
GROUP_KEYS = {"methods", "seeds", "orders", "grid", "overrides"}


@dataclass
class PlannedRun:
    row: str
    method: str
    point: list[str]
    order: str
    seed: int
    overrides: list[str]
    path: str


@dataclass
class Plan:
    description: str = ""
    config: str = ""
    overrides: list[str] = field(default_factory=list)
    orders: dict[str, list[str] | None] = field(default_factory=lambda: {"default": None})
    order_benchmark: dict[str, str] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    methods: list[str] = field(default_factory=list)
    grid: dict[str, list[str]] = field(default_factory=dict)
    groups: list[dict[str, Any]] = field(default_factory=list)
    layout: str = "orders"
    claims: list[str] = field(default_factory=list)
    """The study's paired claims, ``A>B`` (:func:`surecl.report.split_claim`), for its report."""
    orders_given: bool = False
    """Whether the plan names its orders (else a sweep takes its protocol preset's, as without a plan)."""


def plan_names() -> list[str]:
    folder = resources.files("surecl") / "plans"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _text(name_or_path: str) -> tuple[str, str]:
    path = Path(name_or_path)
    # a packaged plan's name stays its name when a folder of that name (its sweep's --out, say) is here
    if path.suffix in (".yaml", ".yml") or path.is_file() or (path.exists() and name_or_path not in plan_names()):
        if not path.is_file():
            raise SureclError(f"--plan: {path} is not a file")
        try:
            return path.read_text(encoding="utf-8-sig"), str(path)
        except UnicodeDecodeError:
            raise SureclError(f"--plan: {path} is not UTF-8 text") from None
        except OSError as e:
            raise SureclError(f"--plan: {path} cannot be read: {e.strerror or e}") from None
    if name_or_path not in plan_names():
        raise SureclError(f"--plan: unknown plan {name_or_path!r} (choose from {', '.join(plan_names())}, or give a .yaml path)")
    return (resources.files("surecl") / "plans" / f"{name_or_path}.yaml").read_text(encoding="utf-8"), f"plan {name_or_path}"


def _strings(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        raise SureclError(f"{where}: expected a list of names or numbers")
    # a name 010 or a ratio 1:2 as written, not 8 or 62; a float as Python prints it (1.0e-3 is
    # 0.001), which names the finished runs of plans written before
    return [written(v) if isinstance(v, int) else str(v) for v in value]


def _seeds(value: Any, where: str) -> list[int]:
    out = []
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [int(v) for v in value]  # seeds read as YAML reads them, like the config's seed
    for v in _strings(value, where):
        try:
            out.append(int(v))
        except ValueError:
            raise SureclError(f"{where}: seed {v!r} is not an integer") from None
    return out


_ORDER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


def _order_name(name: str, where: str) -> str:
    """An order's name, which names its runs' folders: letters, digits, ``_ . + -``, not
    starting with a dot (a ``/`` or ``..`` would put runs outside ``--out``)."""
    if not _ORDER_NAME.match(name):
        raise SureclError(f"{where}: order name {name!r} may hold only letters, digits and _ . + - (it names the runs' folders)")
    return name


def _order_override(order: str) -> str:
    """``data.order=<order>``, quoted where YAML would read the name as another value (``01``, ``1e3``)."""
    try:
        same = str(yaml.safe_load(order)) == order
    except yaml.YAMLError:
        same = False
    return f"data.order={order}" if same else f"data.order='{order}'"


def _order_key(name: Any) -> bool:
    """Whether a mapping's key may name an order: text or a number, as a list of order names
    takes them (not ``null`` or ``yes``, which YAML reads unquoted as None and True)."""
    return isinstance(name, (str, int, float)) and not isinstance(name, bool)


def _orders(value: Any, where: str) -> dict[str, list[str] | None]:
    if isinstance(value, dict):
        out = {}
        for name, tasks in value.items():
            if not _order_key(name):  # as a list of order names takes them
                raise SureclError(f"{where}: order name {name!r} must be text or a number (it names the runs' folders); "
                                  "quote it ('null', 'yes') to mean the text")
            name = written(name)
            _order_name(name, where)
            if tasks is None:
                out[str(name)] = None
            else:
                out[str(name)] = _strings(tasks, f"{where}.{name}")
                if not out[str(name)]:
                    raise SureclError(f"{where}.{name}: an order needs at least one task")
        return out
    return {_order_name(o, where): None for o in _strings(value, where)}


_OPEN, _CLOSE = "[{", "]}"


def _grid_values(text: str, where: str) -> list[str]:
    """A grid axis's values written as one text (``--grid key=v1,v2``), split on the commas
    outside brackets and quotes: ``[q_proj,v_proj],[q_proj]`` is two list values, not four
    pieces. A quote counts where it opens a value (as in YAML); each value is kept as written."""
    values, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"" and not text[start:i].strip():
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth < 0:
                raise SureclError(f"{where}: {text!r} closes a bracket it never opened")
        elif c == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    if quote or depth:
        raise SureclError(f"{where}: {text!r} leaves a {'quote' if quote else 'bracket'} open")
    return [v.strip() for v in [*values, text[start:]] if v.strip()]


def _grid(value: Any, where: str) -> dict[str, list[str]]:
    if not isinstance(value, dict):
        raise SureclError(f"{where}: expected a mapping key.sub -> list of values")
    return {str(k): _strings(_grid_values(v, f"{where}.{k}") if isinstance(v, str) else v, f"{where}.{k}") for k, v in value.items()}


def _claims(value: Any, where: str) -> list[str]:
    """A plan's claims: texts of the form ``A>B`` (checked here; their rows by the sweep)."""
    from surecl.report import split_claim

    if not isinstance(value, list):
        raise SureclError(f"{where}: must be a list of texts like 'A>B' (row A better than row B)")
    out: list[str] = []
    for text in value:
        split_claim(text, where)
        if text not in out:
            out.append(text)
    return out


def plan_rows(runs: list[PlannedRun], dual: list[bool]) -> list[str]:
    """The rows planned runs make in the report: each run's row, and ``<row> (fast)`` where the
    run is dual (``dual``, one flag per run: its built config's ``dual.enabled`` and
    ``eval.fast``), so it reports its fast adapter too."""
    from surecl.report import FAST

    return list(dict.fromkeys(name for r, d in zip(runs, dual) for name in ((r.row, r.row + FAST) if d else (r.row,))))


def check_claims(plan: Plan, rows: list[str], source: str) -> None:
    """Every claim of ``plan`` names two of ``rows`` (the rows its runs make), so a claim with
    a misspelt row stops the sweep before anything trains, not its report at the end."""
    from surecl.report import split_claim

    for text in plan.claims:
        for name in split_claim(text, f"{source}: claims:"):
            if name not in rows:
                raise SureclError(f"{source}: claims: {text!r}: no row {name!r} among the runs the sweep plans "
                                  f"(rows: {', '.join(rows)})")


def load_plan(name_or_path: str) -> Plan:
    text, source = _text(name_or_path)
    try:
        data = safe_yaml(text, source) or {}
    except (yaml.YAMLError, RecursionError):
        raise SureclError(f"{source}: invalid YAML") from None
    if not isinstance(data, dict):
        raise SureclError(f"{source}: top level must be a mapping")
    unknown = sorted(set(data) - PLAN_KEYS)
    if unknown:
        raise SureclError(f"{source}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(PLAN_KEYS))})")
    config = "" if data.get("config") is None else data["config"]
    if not isinstance(config, str):  # str() of a list would name a preset "['tiny'"
        raise SureclError(f"{source}: config: expected text like tiny,seq_lora (presets joined by commas), not {type(config).__name__}")
    description = "" if data.get("description") is None else data["description"]
    if not isinstance(description, str):  # str() of a list would print "['a']" in every report
        raise SureclError(f"{source}: description: expected text, not {type(description).__name__}")
    plan = Plan(description=description, config=config)
    if "overrides" in data:
        plan.overrides = _strings(data["overrides"], f"{source}: overrides")
    if "orders" in data:
        plan.orders = _orders(data["orders"], f"{source}: orders")
        plan.orders_given = True
    if "order_benchmark" in data:
        if not isinstance(data["order_benchmark"], dict):
            raise SureclError(f"{source}: order_benchmark must map order names to benchmark names")
        for k, v in data["order_benchmark"].items():
            if not _order_key(k) or not isinstance(v, str) or not v.strip():
                raise SureclError(f"{source}: order_benchmark: {k!r}: {v!r} must map an order's name (text or a number) to a "
                                  "benchmark's name (text); quote a name YAML reads otherwise ('null', 'yes')")
        plan.order_benchmark = {written(k): v for k, v in data["order_benchmark"].items()}
    if "seeds" in data:
        plan.seeds = _seeds(data["seeds"], f"{source}: seeds")
    if "methods" in data:
        plan.methods = _strings(data["methods"], f"{source}: methods")
    if "grid" in data:
        plan.grid = _grid(data["grid"], f"{source}: grid")
    if "claims" in data:
        plan.claims = _claims(data["claims"], f"{source}: claims")
    if data.get("layout", "orders") not in ("orders", "paper"):
        raise SureclError(f"{source}: layout must be orders or paper")
    plan.layout = data.get("layout", "orders")
    groups = data.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise SureclError(f"{source}: groups must be a list of mappings")
    for k, g in enumerate(groups):
        bad = sorted(set(g) - GROUP_KEYS)
        if bad:
            raise SureclError(f"{source}: groups[{k}]: unknown key(s) {', '.join(bad)} (known: {', '.join(sorted(GROUP_KEYS))})")
        where = f"{source}: groups[{k}]"
        group: dict[str, Any] = {"methods": _strings(g.get("methods", []), f"{where}.methods")}
        if "seeds" in g:
            group["seeds"] = _seeds(g["seeds"], f"{where}.seeds")
        if "orders" in g:
            names = _strings(g["orders"], f"{where}.orders")
            missing = [o for o in names if o not in plan.orders]
            if missing:
                raise SureclError(f"{where}.orders: {', '.join(missing)} not among the plan's orders")
            group["orders"] = names
        if "grid" in g:
            group["grid"] = _grid(g["grid"], f"{where}.grid")
        if "overrides" in g:
            group["overrides"] = _strings(g["overrides"], f"{where}.overrides")
        if not group["methods"]:
            raise SureclError(f"{where}: a group needs methods")
        for key in ("seeds", "orders"):
            if key in group and not group[key]:
                raise SureclError(f"{where}.{key}: empty, so the group would plan no run; give at least one, or leave the key out for the plan's")
        plan.groups.append(group)
    return plan


def _grid_override(point: str) -> str:
    """A grid point ``key=value`` as an override: quoted where YAML would read the value as other
    text (``exp #2`` as ``exp``, a comment; a line break as a space), so the run trains the value
    its folder and row name; a value YAML reads as a number, list or mapping stays as written."""
    key, value = point.split("=", 1)
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = None
    if isinstance(parsed, str) and parsed != value:
        return f"{key}={json.dumps(value)}"
    return point


def grid_points(grid: dict[str, list[str]]) -> list[list[str]]:
    points: list[list[str]] = [[]]
    for key, values in grid.items():
        if not values:
            raise SureclError(f"grid {key}: needs at least one value")
        points = [p + [f"{key}={v}"] for p in points for v in values]
    return points


def check_grid_read(runs: list[PlannedRun], configs: list) -> None:
    """One line, before anything trains, for a grid axis over a key a planned run does not read
    (``ReplayConfig.unread``: ``replay.buffer_size`` under ``replay.buffer_fraction``,
    ``replay.every`` / ``replay.batch_size`` under ``replay.ratio``; any ``replay.*`` key under a
    method that is not ``continual``, MTL, which replays nothing): its rows would be one run
    under several names, a row named for a value it never used. ``configs``: each run's config."""
    from surecl.config import is_continual

    for r, cfg in zip(runs, configs):
        unread = cfg.replay.unread()
        continual = is_continual(cfg.method)
        for point in r.point:
            key = point.split("=", 1)[0].strip()
            if not continual and key.startswith("replay."):
                raise SureclError(f"sweep: grid key {key} is not read by run {r.path} (method {cfg.method} is not continual and "
                                  f"replays nothing), so its rows would be one run under several names; give {r.method} a group "
                                  "without the replay axis")
            if key in unread:
                raise SureclError(f"sweep: grid key {key} is not read by run {r.path} ({unread[key]}), so its rows would be one run "
                                  f"under several names; drop the axis, or unset {unread[key].split('=', 1)[0]}")


def expand(plan: Plan) -> list[PlannedRun]:
    """Every run of the plan: groups (or the plan's methods) x grid points x orders x seeds."""
    groups = plan.groups or [{"methods": plan.methods}]
    if not any(g["methods"] for g in groups):
        raise SureclError("sweep: no methods (give --methods or a plan with methods)")
    runs: list[PlannedRun] = []
    seen: set[str] = set()
    for g in groups:
        orders = g.get("orders", list(plan.orders))
        for method in g["methods"]:
            for point in grid_points(g.get("grid", plan.grid)):
                row = " ".join([method, *point])
                for order in orders:
                    tasks = plan.orders[order]
                    for seed in g.get("seeds", plan.seeds):
                        data = [_order_override(order)] + ([f"data.tasks=[{','.join(tasks)}]"] if tasks else [])
                        overrides = plan.overrides + g.get("overrides", []) + [_grid_override(p) for p in point] + data + [f"seed={seed}", f"preset={row}"]
                        folder = f"order{order}" if order.isdigit() or order == "default" else f"order-{order}"
                        # a method given as a YAML file is its stem there: a path would put the run outside --out
                        name = Path(method).stem if "/" in method or method.endswith((".yaml", ".yml")) else method
                        # a grid value naming a path ("model.name=../models/a") is one folder, never a way out of --out
                        path = "/".join([name, *(part.replace("/", "_").replace("\\", "_") for part in point), folder, f"seed{seed}"])
                        if path in seen:
                            raise SureclError(f"sweep: run {path} is planned twice (a method in two groups?)")
                        seen.add(path)
                        runs.append(PlannedRun(row, method, point, order, seed, overrides, path))
    return runs
