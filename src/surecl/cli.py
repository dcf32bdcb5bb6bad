"""Command line: ``surecl run | sweep | report | list``.

Every user error is a :class:`~surecl.errors.SureclError`: one line on stderr, exit code 2, no
traceback (``--debug`` shows one).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

from surecl.errors import RunBusy, SureclError
from surecl.files import check_out_dir

NAMED_KEYS = ("seed", "data.order", "data.benchmark", "preset")
"""Overrides the default run folder's name holds already (its order, seed and benchmark parts)."""


def _out_dir(arg: str | None, cfg, overrides: list[str] | tuple[str, ...] = ()) -> Path:
    """``--out``, else ``runs/<preset>-<benchmark>-o<order>-s<seed>`` followed by the command
    line's other overrides, by key (``-dual.beta=0.995``; a key given twice by its last value):
    a run with other overrides gets its own folder, and the same command again, its overrides in
    any order, finds its own to resume. Options that change no result (``RESULT_NEUTRAL``:
    ``train.checkpoint_every``, ...) name nothing, so a resume may change them as it may with
    ``--out``. A long tail is cut and ended by a hash of the whole, so two tails that share their
    start stay two folders. A folder named without overrides (before they named it) that holds
    this very run (its ``config.yaml``) is taken, said once."""
    if arg is not None:
        check_out_dir(arg)
        return Path(arg)
    from surecl.config import RESULT_NEUTRAL

    order = cfg.data.order if not cfg.data.tasks else "custom"
    bench = Path(cfg.data.benchmark).name or "bench"
    preset = str(cfg.preset or cfg.method)
    if preset.endswith((".yaml", ".yml")):  # a preset given as a YAML file: its name
        preset = Path(preset).stem
    name = f"{preset}-{bench}-o{order}-s{cfg.seed}"
    unnamed = set(NAMED_KEYS) | {".".join(path) for path in RESULT_NEUTRAL}
    given: dict[str, str] = {}
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if item.strip() and key not in unnamed:
            given.pop(key, None)
            given[key] = item.strip()
    parts = [given[k] for k in sorted(given)]
    tail = "-".join(parts)
    if len(tail) > 80:
        import hashlib

        tail = f"{tail[:64]}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:10]}"
    plain = Path("runs") / _safe_name(name)
    if not tail:
        return plain
    out = Path("runs") / _safe_name(f"{name}-{tail}")
    if not out.exists() and _holds_run(plain, cfg):
        print(f"surecl: {plain} holds this run (its config.yaml), started before overrides named the default folder: "
              "it goes on there", file=sys.stderr)
        return plain
    return out


def _safe_name(name: str) -> str:
    """A folder name of ``name``: characters other than letters, digits and ``._+=-`` as ``_``, no leading dot."""
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", name).lstrip(".")


def _holds_run(folder: Path, cfg) -> bool:
    """Whether ``folder``'s ``config.yaml`` is ``cfg`` (:func:`surecl.config.same_config`)."""
    import yaml

    from surecl.config import same_config

    try:
        saved = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(saved, dict) and same_config(saved, cfg)


def _finished(out: Path, cfg, say: bool = True) -> bool:
    """Whether ``out`` holds this config's finished run with every final output in place (a run
    whose results.json is there but, say, its adapters are not, is completed by a rerun, which
    ``say`` announces)."""
    path = out / "results.json"
    if not path.is_file():
        return False
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        saved = results["config"]
        if not isinstance(saved, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise SureclError(f"{path}: exists but is not a readable results file; choose another --out") from None
    from surecl.config import same_config

    if not same_config(saved, cfg):
        raise SureclError(f"{out}: already holds a finished run with a different config; choose another --out")
    _check_same_data(out, results, cfg)
    from surecl.checkpoint import Manifest

    missing = Manifest(out).missing_final()
    if missing:
        if say:
            print(f"surecl: {out}: finished, but {', '.join(missing)} missing; writing it again from the last checkpoint", file=sys.stderr)
        return False
    return True


_FINGERPRINTS: dict[str, dict[str, str]] = {}
"""Each stream's task fingerprints, by its data config and seed, within one command."""


def _check_same_data(out: Path, results: dict, cfg) -> None:
    """A finished run's tasks are the data this config loads now: each task's fingerprint of its
    sampled rows (results.json ``provenance``; runs written before it, and tasks passed from
    Python, have none to compare) against the stream loaded again. Edited data is one line,
    not "nothing to do" over results of the old rows."""
    provenance = results.get("provenance")
    data = provenance.get("data") if isinstance(provenance, dict) else None
    if not isinstance(data, dict):
        return  # written before provenance, or not surecl's shape: nothing to compare
    saved = data.get("fingerprints")
    if not isinstance(saved, dict) or not saved or data.get("source") != "config":
        return
    from surecl.data.loading import load_stream
    from surecl.data.task import composed_keys

    saved = composed_keys(saved)  # names as they are read now

    key = json.dumps([cfg.to_dict().get("data"), cfg.seed], sort_keys=True, default=str)
    if key not in _FINGERPRINTS:  # a sweep asks once per finished run: many share one stream
        _FINGERPRINTS[key] = {t.name: t.fingerprint() for t in load_stream(cfg)}
    now = _FINGERPRINTS[key]
    changed = [name for name in now if name in saved and saved[name] != now[name]]
    if changed:
        from surecl.errors import start_over

        raise SureclError(f"{out}: its finished run was trained and tested on other rows of task {changed[0]} (the data changed "
                          f"since); {start_over()} to train it again on this data, or choose another --out")


def check_given(value: str | None, flag: str) -> None:
    """One line for an option given empty (an unset shell variable): ``--config ''`` ran the
    defaults and ``--plan ''`` the default sweep without a word."""
    if value is not None and not value.replace(",", " ").strip():
        raise SureclError(f"{flag}: empty; give a value (an unset shell variable gives an empty value)")


def cmd_run(args) -> int:
    from surecl.config import build_config

    check_given(args.config, "--config")
    cfg = build_config(args.config, args.overrides)
    if args.out is not None:  # a dry run refuses what the run would (the default --out is a plain name under runs/)
        check_out_dir(args.out)
    from surecl.plugins.tracking import check_trackers

    for value in args.log_with or []:  # an empty one (an unset variable) ran with no tracker without a word
        check_given(value, "--log-with")
    log_with = check_trackers([n.strip() for v in args.log_with or [] for n in v.split(",") if n.strip()])
    if args.dry_run:
        from surecl.plan import describe

        print(describe(cfg))
        return 0
    out = _out_dir(args.out, cfg, args.overrides)
    check_out_dir(out)
    if args.no_resume:
        print("surecl: --no-resume is deprecated; it now means --fresh", file=sys.stderr)
        args.fresh = True
    from surecl.checkpoint import check_outputs
    from surecl.run_folder import config_outputs

    # a link or a user's file where the run writes (its adapters, model/, checkpoints too): refused before any compute
    check_outputs(out, fresh=args.fresh, extra=tuple(config_outputs(cfg, out, log_with)))
    if not args.fresh and _finished(out, cfg):
        print(f"surecl: {out} already finished (results.json); nothing to do", file=sys.stderr)
        return 0
    from surecl.trainer import run

    results = run(cfg, out, fresh=args.fresh, progress=not args.quiet, log_with=log_with)
    if not _main_process():
        return 0
    change = (results.get("general") or {}).get("change") or {}
    general = ("  general " + ", ".join(f"{part} {v:+.2f}" for part, v in change.items())) if change else ""
    print(f"FP {results['fp']:.1f}  AP {results['ap'] if results['ap'] is None else round(results['ap'], 1)}  "
          f"forgetting {results['forgetting'] if results['forgetting'] is None else round(results['forgetting'], 1)}{general}  -> {out}/results.json")
    return 0


def _main_process() -> bool:
    """Whether this process is a run's main one (``RANK`` unset or 0): under ``accelerate launch``
    every rank returns the results, and the summary line is said once."""
    return os.environ.get("RANK", "").strip() in ("", "0")


ORDER_LISTS = "give each order its task list in a plan (orders: {name: [task, ...]}) or sweep one order"
"""How a sweep over several orders of one task list is mended (both checks of :func:`cmd_sweep` say it)."""

SWEEP_KEYS = {"seed": "--seeds (or a plan's seeds)", "data.order": "--orders (or a plan's orders)",
              "preset": "the row's name (its method and grid point)"}
"""Keys a sweep sets for each run itself, last: given as an override or a grid axis they would be
replaced without a word (every "seed" of a grid the same seed-0 run under another row name)."""


def check_sweep_keys(plan) -> None:
    """One line for an override or grid key a sweep sets itself (:data:`SWEEP_KEYS`), and for
    ``data.tasks`` given once for several orders (every order would be that one task list)."""
    overrides = [*plan.overrides, *(o for g in plan.groups for o in g.get("overrides", []))]
    keys = [o.split("=", 1)[0].strip() for o in overrides if "=" in o]
    keys += [*plan.grid, *(k for g in plan.groups for k in g.get("grid", {}))]
    for key in keys:
        if key in SWEEP_KEYS:
            raise SureclError(f"sweep: {key} is set for each run by the sweep; give it with {SWEEP_KEYS[key]}, not as an override or grid key")
    if "data.tasks" in keys and len(plan.orders) > 1:
        raise SureclError(f"sweep: data.tasks gives one task list to every order, so the orders would be one stream; {ORDER_LISTS}")


def _preset_orders(config: str) -> list[str] | None:
    """The ``orders`` a protocol preset (standard-cl, lnt) names, if any of ``config`` has one."""
    from surecl.config import load_yaml
    from surecl.sweep import _strings

    found = None
    for name in (c.strip() for c in (config or "").split(",") if c.strip()):
        data, source = load_yaml(name)
        if data.get("orders"):
            found = _strings(data["orders"], f"{source}: orders")
    return found


def sweep_plan(args):
    """The sweep's plan: ``--plan`` (or the default methods), with the command line's
    ``--config``, ``--methods``, ``--seeds``, ``--orders``, ``--grid`` and ``--layout``
    replacing the plan's own; orders default to the protocol preset's."""
    from surecl.sweep import Plan, _grid, _orders, _seeds, _strings, load_plan

    check_given(args.plan, "--plan")
    check_given(args.config, "--config")
    plan = load_plan(args.plan) if args.plan else Plan(methods=["seq_lora", "reservoir", "surprise", "slow_surprise"])
    # options given on the command line replace the plan's
    if args.config is not None:
        plan.config = args.config
    if args.methods is not None:
        named = _strings(args.methods, "--methods")
        if plan.groups:  # a filter of the plan's groups: each method keeps its group's seeds, orders, grid and overrides
            kept = [{**g, "methods": [m for m in g["methods"] if m in named]} for g in plan.groups]
            kept = [g for g in kept if g["methods"]]
            plain = [m for m in named if not any(m in g["methods"] for g in plan.groups)]  # in no group: the plan's own settings
            plan.groups = kept + ([{"methods": plain}] if plain else [])
        plan.methods = named
    if args.seeds is not None:
        plan.seeds = _seeds(args.seeds, "--seeds")
        for g in plan.groups:
            g.pop("seeds", None)
    if args.orders is not None:
        named = _orders(args.orders, "--orders")
        # orders the plan defines keep their task lists
        plan.orders = {o: plan.orders.get(o) for o in named}
        for g in plan.groups:
            g.pop("orders", None)
    elif not args.plan or (not plan.orders_given and not any("orders" in g for g in plan.groups)):
        # a plan that names no orders runs its protocol preset's, as the command line does without a plan
        plan.orders = _orders(_preset_orders(plan.config) or ["default"], "--orders")
    if args.grid:
        specs = {}
        for spec in args.grid:
            if "=" not in spec:
                raise SureclError(f"--grid {spec!r} must look like key.sub=v1,v2")
            key, values = spec.split("=", 1)
            if key.strip() in specs:  # the second replaced the first without a word
                raise SureclError(f"--grid {key.strip()} given twice: give its values once, comma-separated (--grid {key.strip()}=v1,v2)")
            specs[key.strip()] = values
        plan.grid = _grid(specs, "--grid")
        for g in plan.groups:
            g.pop("grid", None)
    if args.layout is not None:
        plan.layout = args.layout
    if not (plan.orders and plan.seeds):
        raise SureclError("sweep: --methods, --orders and --seeds each need at least one value")
    _check_methods(plan, "--methods" if args.methods is not None else f"--plan {args.plan}: methods")
    return plan


def _check_methods(plan, where: str) -> None:
    """One line for a method entry whose preset is a setting (``kind: setting``: tiny, cpt, lnt):
    the run took the default method and trained it under the setting's name as its row."""
    from surecl.config import load_yaml

    for method in dict.fromkeys([*plan.methods, *(m for g in plan.groups for m in g["methods"])]):
        data, _ = load_yaml(method)
        if isinstance(data, dict) and data.get("kind") == "setting":
            raise SureclError(f"{where}: {method} is a setting preset, not a method; apply it to every run with --config "
                              "(or a plan's config:) and name methods here")


def _folder_order(cfg) -> list[str]:
    """The tasks a run on a benchmark folder trains, when its order loses some to
    ``data.allow_missing`` (CL_Benchmark without yahoo makes orders 1 and 2 one list); [] for
    every other stream."""
    from surecl.data.cl_benchmark import ORDERS, order_missing, resolve_order
    from surecl.data.loading import ONE_ORDER

    if not cfg.data.allow_missing or cfg.data.benchmark in ONE_ORDER:
        return []
    root = Path(cfg.data.benchmark).expanduser()
    if cfg.data.order not in (*ORDERS, "default"):  # an unknown order: _check_order says so, naming the run
        return []
    if not root.is_dir() or not order_missing(root, cfg.data.order, []):
        return []
    return resolve_order(root, cfg.data.order, [], True)


def _check_order(cfg, path: str, checked: set) -> None:
    """One line for a planned run whose order its benchmark does not have
    (:func:`~surecl.data.loading.check_order`), before the sweep writes its plan: written
    there, the run would fail at every resume and stay a hole in every report."""
    import dataclasses

    from surecl.data.loading import check_order

    data = cfg.data
    key = json.dumps(dataclasses.asdict(data), sort_keys=True, default=str)  # the whole section: its files name tasks too
    if key in checked:
        return
    checked.add(key)
    try:
        check_order(data, "give an order its task list in a plan (orders: {name: [task, ...]})", folder=True)
    except SureclError as exc:
        raise SureclError(f"sweep: run {path}: {exc}") from None


def _run_config(plan, r):
    """The config of planned run ``r``: the plan's presets, then the run's method preset and overrides."""
    from surecl.config import build_config

    return build_config(f"{plan.config},{r.method}" if plan.config else r.method, r.overrides)


def _reports_fast(cfg) -> bool:
    """Whether a run of ``cfg`` reports its fast adapter beside the slow one (a ``<row> (fast)``
    row): as the run decides it (``run_setup``), so a method whose own weights answer
    (``fast_eval`` false: per_task) plans no fast row its runs never write."""
    if not (cfg.dual.enabled and cfg.eval.fast):
        return False
    from surecl.registry import method_class, method_config

    return bool(method_class(cfg.method)(method_config(cfg)).fast_eval)


def cmd_sweep(args) -> int:
    """Run every planned run not finished yet; a run that fails is named and the next one runs
    (exit code 2 at the end when any failed)."""
    from surecl.checkpoint import lock_holder
    from surecl.report import write_sweep_plan
    from surecl.sweep import expand
    from surecl.trainer import run

    check_out_dir(args.out)  # the text as given: Path("") is "."
    root = Path(args.out)
    _check_metric(args)  # before any run trains: the closing report reads it
    plan = sweep_plan(args)
    # the command line's overrides replace the plan's own; a group's overrides and grid values still decide their runs
    plan.overrides = plan.overrides + list(args.overrides)
    check_sweep_keys(plan)
    planned, todo = [], []
    streams: dict[str, set[str]] = {}
    lists: dict[tuple, str] = {}  # (row, seed, task list) -> the order that trains it
    runs_of: dict[str, str] = {}  # a run's whole config (its row's name aside) -> the first planned path that trains it
    runs = expand(plan)
    for r in runs:
        cfg = _run_config(plan, r)
        if cfg.data.benchmark in ("tiny", "none") and not cfg.data.tasks:
            streams.setdefault(cfg.data.benchmark, set()).add(r.order)
        trained = list(cfg.data.tasks) or _folder_order(cfg)
        if trained:  # however it was set (an override, a mapping, a config file, a folder lacking tasks): one list is one order
            seen = lists.setdefault((r.row, r.seed, tuple(trained)), r.order)
            if seen != r.order:
                raise SureclError(f"sweep: orders {seen} and {r.order} of row {r.row} train the same task list "
                                  f"({', '.join(trained)}), so they would be one stream under two names; {ORDER_LISTS}")
        same = json.dumps({**cfg.to_dict(), "preset": None}, sort_keys=True, default=str)  # the run itself, whatever its row is called
        if same in runs_of:  # a warning: a finished study may hold both (a grid value equal to the method's default)
            print(f"surecl: warning: {runs_of[same]} and {r.path} are the same run under two names (a grid value written two ways, "
                  "e.g. 1 and 1.0, or equal to the method's default); it trains twice and counts as two rows", file=sys.stderr)
        runs_of.setdefault(same, r.path)
        todo.append((cfg, root / r.path))
        planned.append({"row": r.row, "method": r.method, "grid": dict(p.split("=", 1) for p in r.point), "order": r.order,
                        "seed": r.seed, "dual": _reports_fast(cfg), "path": r.path})
    from surecl.sweep import check_grid_read

    check_grid_read(runs, [cfg for cfg, _ in todo])  # a grid axis its runs do not read: one run under several row names
    if plan.claims:  # a misspelt row stops the sweep now, not its report after the runs (the whole plan's rows: --methods may pick some)
        from surecl.sweep import check_claims, load_plan, plan_rows

        try:  # the plan as written (a plan naming no methods leaves them to --methods)
            written = load_plan(args.plan) if args.plan else None
            full = expand(written) if written else []
        except SureclError:
            full = []
        mine = {r["path"] for r in planned}
        others = [r for r in full if r.path not in mine]
        dual = []
        for r in others:  # the plan's runs this sweep leaves out: dual as their configs say (one that cannot be built: either row)
            try:
                dual.append(_reports_fast(_run_config(written, r)))
            except SureclError:
                dual.append(True)
        check_claims(plan, plan_rows(others + runs, dual + [r["dual"] for r in planned]), args.plan or "sweep")
    for benchmark, orders in streams.items():
        if len(orders) > 1:  # one stream under several names: a report would count its runs as independent units
            what = "the tiny benchmark" if benchmark == "tiny" else "a stream of data.jsonl / data.hf tasks"
            raise SureclError(f"sweep: orders {', '.join(sorted(orders))} of {what} are one stream (it has no numbered orders); {ORDER_LISTS}")
    checked: set = set()
    for (cfg, _), r in zip(todo, planned):
        _check_order(cfg, r["path"], checked)
    # the plan first, so `surecl report` can name the runs a killed or failed sweep did not finish
    meta = {"config": plan.config, "overrides": list(args.overrides), "plan": args.plan, "order_benchmark": plan.order_benchmark,
            "claims": plan.claims}
    from surecl.report import PLAN_FILE

    if not (root / PLAN_FILE).exists():  # a folder no sweep wrote: the end-of-sweep tables must not replace a user's files
        ends = ["report"] if plan.layout == "paper" else ["table.md", "table.csv"]
        taken = [n for n in ends if (root / n).exists()]
        if taken:
            raise SureclError(f"sweep: {root / taken[0]} exists and no surecl sweep wrote {root}; the sweep's table would "
                              "replace it: move it away or choose another --out")
    kept = _surecl_file(root.resolve() / "table.csv") if plan.layout != "paper" else None
    if kept:  # the closing table's refusal, said before the runs train rather than after
        raise SureclError(f"sweep: --out {root}: the sweep's table {root / 'table.csv'} {kept}: choose another --out")
    from surecl.errors import starting_over

    # its runs' errors name what starts one over: a sweep has no --fresh
    with starting_over("remove that run folder and rerun the sweep"):
        # every finished run against its planned config first: an edited plan stops before it trains anything
        finished = {k for k, (cfg, out) in enumerate(todo, 1) if _finished(out, cfg, say=False)}  # (said when its turn comes)
        write_sweep_plan(root, planned, meta)
        failed: list[str] = []
        for k, (cfg, out) in enumerate(todo, 1):
            if k in finished or _finished(out, cfg):
                print(f"[{k}/{len(todo)}] {out}: finished, skipped", file=sys.stderr)
                continue
            holder = lock_holder(out)  # before building the run: a model load is not free
            if holder is not None:
                print(f"[{k}/{len(todo)}] {out}: {holder} is running there, skipped", file=sys.stderr)
                continue
            print(f"[{k}/{len(todo)}] {out}", file=sys.stderr)
            try:
                run(cfg, out, resume=True, progress=not args.quiet)
            except RunBusy as busy:  # another worker of the same study has it
                print(f"[{k}/{len(todo)}] {out}: {busy.holder} is running there, skipped", file=sys.stderr)
            except SureclError as exc:  # this run cannot go on (e.g. a non-finite loss): the others still can
                print(f"[{k}/{len(todo)}] {out}: error: {exc}", file=sys.stderr)
                failed.append(str(out))
            except _out_of_memory() as exc:
                print(f"[{k}/{len(todo)}] {out}: error: {_memory_line(exc)}", file=sys.stderr)
                failed.append(str(out))
        if failed:
            print(f"surecl: {len(failed)} run(s) failed and were left to resume: {', '.join(failed[:10])}"
                  + (" ..." if len(failed) > 10 else ""), file=sys.stderr)
    if plan.layout == "paper":
        code = cmd_report(argparse.Namespace(dirs=[str(root)], metric=args.metric, csv=None, md=None, layout="paper",
                                             out_dir=str(root / "report"), no_fast=False, claims="default", claim=[], order_benchmark=[]))
    else:
        code = cmd_report(argparse.Namespace(dirs=[str(root)], metric=args.metric, csv=str(root / "table.csv"), md=str(root / "table.md")))
    return 2 if failed else code


def _order_benchmarks(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        order, _, bench = spec.partition("=")
        if not order.strip() or not bench.strip():
            raise SureclError(f"--order-benchmark {spec!r} must look like ORDER=BENCHMARK, e.g. lnt8a=LNT")
        out[order.strip()] = bench.strip()
    return out


def _check_metric(args) -> None:
    from surecl.report import METRICS

    if getattr(args, "metric", None) is not None and args.metric not in METRICS:
        raise SureclError(f"--metric: unknown metric {args.metric!r} (choose from {', '.join(METRICS)})")


def cmd_report(args) -> int:
    from surecl.report import aggregate, one_metric, pooled_differences, read_results, table_csv, table_markdown

    _check_metric(args)
    if getattr(args, "layout", "orders") != "paper":  # the orders table has none of these: they were ignored without a word
        given = [flag for key, flag in _PAPER_ONLY.items() if getattr(args, key, None)]
        given += ["--unit"] if getattr(args, "unit", "auto") != "auto" else []
        given += ["--claims"] if getattr(args, "claims", "default") != "default" else []
        if given:
            raise SureclError(f"{', '.join(given)}: only with --layout paper")
    for flag, value in (("--md", getattr(args, "md", None)), ("--csv", getattr(args, "csv", None))):
        if value is not None and not value.strip():
            raise SureclError(f"{flag}: empty; give a file (an unset shell variable gives an empty value)")
        if value and value != "-" and (Path(value).is_dir() or not Path(value).parent.is_dir()):
            raise SureclError(f"{flag}: {value} is a folder" if Path(value).is_dir() else f"{flag}: the folder of {value} does not exist")
    _check_results([Path(d) for d in args.dirs])
    _check_report_files(args)
    to_stdout = "-" in (getattr(args, "md", None), getattr(args, "csv", None))  # stdout holds what was asked for, alone
    if getattr(args, "layout", "orders") == "paper":
        from surecl.report import paper_report

        _check_paper_metric([Path(d) for d in args.dirs], args.metric)
        rep = paper_report([Path(d) for d in args.dirs], args.metric, fast=not args.no_fast, claims=args.claims,
                           custom_claims=args.claim, order_benchmark=_order_benchmarks(args.order_benchmark),
                           unit=getattr(args, "unit", "auto"))
        if args.out_dir is not None:
            check_out_dir(args.out_dir, "--out-dir")
        if not to_stdout:
            print(rep.markdown(images=bool(args.out_dir)))
        if args.out_dir:
            written = rep.write(Path(args.out_dir))
            print(f"surecl: wrote {len(written)} files to {args.out_dir} (report.md, main.md/.csv, ...)", file=sys.stderr)
        _write_report(args.md, rep.markdown())
        _write_report(args.csv, rep.tables[0].csv)
        return 0
    found = read_results([Path(d) for d in args.dirs])
    one_metric(found)
    runs = [r for _, r in found]
    orders, rows = aggregate(runs, args.metric)
    _check_null_metric(runs, args.metric, bool(rows))
    for line in pooled_differences(runs):
        print(f"surecl: warning: runs pooled into one cell or one row's average differ in configuration: {line}", file=sys.stderr)
    md = table_markdown(orders, rows, args.metric, runs[0].get("metric", "accuracy"))
    if not to_stdout:
        print(md)
    _write_report(args.csv, table_csv(orders, rows))
    _write_report(args.md, md)
    return 0


def _null_why(res: dict, metric: str) -> str:
    """Why a run's results.json has no ``metric`` (null, or absent), in a few words."""
    from surecl.report import DIAGONAL_ONLY, STREAM_ONLY, joint_run

    ev = res["config"].get("eval")
    matrix = res.get("accuracy_matrix")
    if metric not in res:
        return "absent from results.json (an earlier version's file)"
    if metric in DIAGONAL_ONLY and isinstance(ev, dict) and ev.get("matrix") == "fp_ap":
        return "eval.matrix=fp_ap evaluates each task just learned and every task at the end, not the earlier tasks after each stage"
    if metric == "bwt" and len(res["tasks"]) == 1:
        return "a one-task stream has no earlier task to transfer back to"
    if metric in STREAM_ONLY and isinstance(matrix, list) and joint_run(matrix):
        return "a one-stage run (MTL) has no stream to measure along"
    return "null in results.json"


def _check_null_metric(runs: list[dict], metric: str, any_left: bool) -> None:
    """The orders table leaves out a run whose ``metric`` is null: one line (exit 2, nothing
    written) when that leaves no row, a warning naming how many when it leaves some out; an
    empty table with a header alone was printed and written with exit code 0."""
    null = [r for r in runs if r.get(metric) is None]
    if not null:
        return
    why: dict[str, int] = {}
    for r in null:
        reason = _null_why(r, metric)
        why[reason] = why.get(reason, 0) + 1
    words = "; ".join(reason if len(null) == 1 else f"{n}: {reason}" for reason, n in why.items())
    if not any_left:
        raise SureclError(f"report: no run has {metric}: {'the run leaves' if len(null) == 1 else f'each of the {len(null)} runs leaves'} "
                          f"it null in results.json ({words}); choose another --metric")
    print(f"surecl: warning: the table leaves out {len(null)} of {len(runs)} runs, whose {metric} is null in results.json ({words})",
          file=sys.stderr)


def _check_paper_metric(paths: list[Path], metric: str) -> None:
    """The paper layout, asked for a metric no run has (``bwt`` of one-task runs), printed and
    wrote tables of dashes with every run "missing" and exit code 0: the orders table's one line
    (:func:`_check_null_metric`). Some runs without it stay in its "Missing runs" table, and
    runs whose null is by design there (:data:`~surecl.report.NOT_APPLICABLE_WHY`: a one-stage
    run's stream metrics, ``avg_incremental`` under ``eval.matrix=fp_ap``) get its tables'
    "does not apply" caption instead."""
    from surecl.report import DIAGONAL_ONLY, STREAM_ONLY, joint_run, read_results

    def by_design(r: dict) -> bool:
        ev = (r.get("config") or {}).get("eval")
        matrix = r.get("accuracy_matrix")
        return ((metric in DIAGONAL_ONLY and isinstance(ev, dict) and ev.get("matrix") == "fp_ap")
                or (metric in STREAM_ONLY and isinstance(matrix, list) and joint_run(matrix)))

    runs = [r for _, r in read_results(paths)]  # (no results at all: its one line, as the report's own read says it)
    if all(r.get(metric) is None for r in runs) and not any(by_design(r) for r in runs):
        _check_null_metric(runs, metric, False)


def _write_report(value: str | None, text: str) -> None:
    """``--md`` / ``--csv``'s file (``-``: standard output), if given."""
    from surecl.checkpoint import write_text

    if value == "-":
        sys.stdout.write(text)
    elif value:
        write_text(Path(value), text)


def _check_report_files(args) -> None:
    """``--md`` / ``--csv`` name a file the report may replace (an atomic write puts a new regular
    file in its place), and ``--out-dir`` a folder it writes report.md into: one line, nothing
    written, for a symbolic link, something other than a regular file (a device, a FIFO), one
    of the results.json files being read, a path inside a run folder being reported (its own
    report.md, ...) or inside any other (:func:`_surecl_file`: ``--csv`` over another run's
    results.json left that run unreadable), or one file named twice."""
    results = set()
    for d in args.dirs:
        root = Path(d)
        results.update(f.resolve() for f in ([root] if root.is_file() else sorted(root.rglob("results.json")) if root.is_dir() else []))
    runs = {f.parent for f in results}
    named: dict[Path, str] = {}
    if getattr(args, "md", None) == "-" and getattr(args, "csv", None) == "-":
        raise SureclError("--md - and --csv -: both on standard output; write one of them to a file")
    for flag, value in (("--md", getattr(args, "md", None)), ("--csv", getattr(args, "csv", None)), ("--out-dir", getattr(args, "out_dir", None))):
        if not value or value == "-":
            continue
        path = Path(value)
        where = path.parent.resolve() / path.name if path.name not in ("", ".", "..") else path.resolve()
        if flag != "--out-dir":
            if path.is_symlink():
                raise SureclError(f"{flag}: {value} is a symbolic link (to {os.readlink(path)}); the report would replace the link "
                                  "with a file: name the file itself, or another path")
            if path.exists() and not path.is_file():
                raise SureclError(f"{flag}: {value} exists and is not a regular file (a device, a FIFO, a socket); the report "
                                  "would replace it with a file: choose another path")
            if where in results:
                raise SureclError(f"{flag}: {value} is one of the results.json files being reported; choose another path")
            kept = _surecl_file(where)
            if kept:
                raise SureclError(f"{flag}: {value} {kept}: write it elsewhere")
            if where in named:
                raise SureclError(f"{flag}: {value} is the file {named[where]} names too; give each its own")
            named[where] = flag
        inside = next((r for r in sorted(runs) if r == where or r in where.parents), None)
        if inside is not None:
            raise SureclError(f"{flag}: {value} is inside the run folder {inside}, which is being reported (the report would "
                              "replace its files); write it elsewhere")


RESULT_KEYS = ("config", "tasks", "accuracy_matrix")
"""The keys that make a results.json a surecl run's."""


def _is_results(path: Path) -> bool:
    """Whether ``path`` is a surecl run's results.json (a mapping with :data:`RESULT_KEYS`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and set(RESULT_KEYS) <= set(data)


def _run_files(folder: Path) -> list[str]:
    """A run folder's own files where it holds no manifest or lock (a run made before them, or a
    study's committed results.json and report.md): a surecl results.json or a run's config.yaml,
    beside another file a run writes (a copied config.yaml or results.json alone in a project's
    folder does not make it a run folder)."""
    from surecl.config import SAVED_HEAD

    if not any(os.path.lexists(folder / name) for name in ("report.md", "buffer.json", "log.jsonl", "checkpoints", "adapters")):
        return []
    found = []
    if (folder / "results.json").is_file() and _is_results(folder / "results.json"):
        found.append("results.json")
    try:
        with open(folder / "config.yaml", encoding="utf-8") as f:
            if f.read(len(SAVED_HEAD)) == SAVED_HEAD:
                found.append("config.yaml")
    except (OSError, ValueError):
        pass
    return found


def _surecl_file(where: Path) -> str | None:
    """Why ``where``, a ``--md`` / ``--csv`` target, is a file surecl keeps (``is ...; ...``), or None:
    a path inside any run folder (one holding the run's manifest or lock, or, made before those
    or committed without them, a surecl results.json or a run's config.yaml: its results.json,
    config.yaml, report.md, ...; a name the run has not written yet would stop its rerun), a
    sweep's plan, a run's results.json in a folder without a manifest, surecl's own records.
    A report's tables (``--out-dir``'s) and any other file stay the user's to replace."""
    from surecl.checkpoint import LOCK, MANIFEST
    from surecl.report import PLAN_FILE, PLAN_KIND, PLAN_LOCK, REPORT_MARK

    for folder in where.parents:
        marks = [n for n in (MANIFEST, LOCK) if os.path.lexists(folder / n)] or _run_files(folder)
        if marks:
            return f"is inside the run folder {folder} (it holds {marks[0]}); a report never writes among a run's files"
    if where.name in (REPORT_MARK, PLAN_LOCK) and os.path.lexists(where):
        return f"is surecl's own record ({where.name}); the report would replace it"
    if where.name == "results.json" and where.is_file() and _is_results(where):
        return "is a surecl run's results.json; the report would replace it"
    if where.name == PLAN_FILE and where.is_file():
        try:
            data = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return None
        if isinstance(data, dict) and data.get("kind") == PLAN_KIND:
            return "is a sweep's plan (surecl sweep wrote it; its report reads it); the report would replace it"
    return None


def _check_results(paths: list[Path]) -> None:
    """Every results.json under ``paths`` is a run's results (a mapping with its config, tasks
    and accuracy matrix); one line naming the first that is not."""
    for root in paths:
        files = [root] if root.is_file() else sorted(root.rglob("results.json")) if root.is_dir() else []
        for path in files:
            try:
                res = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # the reader names unreadable files itself
            missing = [k for k in RESULT_KEYS if not isinstance(res, dict) or k not in res]
            if missing or not isinstance(res.get("config"), dict):
                raise SureclError(f"{path}: not a surecl results file (no {', '.join(missing) or 'config mapping'}); "
                                  "move it away or name the run folders to report")
            wrong = _wrong_types(res)
            if wrong:
                raise SureclError(f"{path}: not a surecl results file ({wrong}); move it away or name the run folders to report")


def _wrong_types(res: dict) -> str | None:
    """What in a results.json has a type surecl never writes (the report would fail on it with a
    traceback), or None."""
    tasks = res.get("tasks")
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        return "tasks is not a list of task names"
    if "metric" in res and not isinstance(res["metric"], str):
        return "metric is not a name"
    cfg = res["config"]
    for section in ("data", "dual", "replay", "train", "model", "lora", "eval"):
        if section in cfg and not isinstance(cfg[section], dict):
            return f"config.{section} is not a mapping"
    general = res.get("general")
    if general is not None and (not isinstance(general, dict) or not all(isinstance(v, (dict, list, str, int, float)) or v is None
                                                                          for v in general.values())):
        return "general is not a mapping"
    if isinstance(general, dict) and "metrics" in general and not isinstance(general["metrics"], dict):
        return "general.metrics is not a mapping"
    prov = res.get("provenance")
    if prov is not None and not isinstance(prov, dict):
        return "provenance is not a mapping"
    for part in ("model", "data"):
        if isinstance(prov, dict) and prov.get(part) is not None and not isinstance(prov[part], dict):
            return f"provenance.{part} is not a mapping"
    return None


def cmd_list(args) -> int:
    from surecl.config import load_yaml, preset_names
    from surecl.data.cl_benchmark import BENCHMARK_OF_ORDER, ORDERS
    from surecl.registry import method_names, policy_names

    print("methods:  " + ", ".join(sorted(method_names())))
    print("replay:   " + ", ".join(policy_names()))
    print("presets:")
    for name in preset_names():
        data, _ = load_yaml(name)
        print(f"  {name:16s} {data.get('description', '')}")
    from surecl.sweep import load_plan, plan_names

    print("sweep plans (surecl sweep --plan NAME):")
    for name in plan_names():
        print(f"  {name:16s} {load_plan(name).description}")
    print("benchmarks: embedded (offline default, 4 tasks), instruct (4 instruction tasks, built from the bigbench package), "
          "tiny (fixture), none (only data.jsonl / data.hf tasks), or a CL_Benchmark folder path")
    print("orders:")
    for k, tasks in ORDERS.items():
        print(f"  {k} ({BENCHMARK_OF_ORDER[k]}): {', '.join(tasks)}")
    return 0


def _registered() -> str:
    """The registered methods and replay policies (those of ``surecl.register_method`` /
    ``register_policy`` included), for ``--help``."""
    from surecl.registry import method_names, policy_names

    return (f"methods (method=NAME): {', '.join(sorted(method_names()))}; "
            f"replay policies (replay.policy=NAME): {', '.join(policy_names())}")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (``surecl: error: ...``, exit 2), as every other error,
    and no abbreviated options: ``--imp`` was taken for ``--import`` without importing (main
    reads ``--import`` before parsing), ``report --out`` for ``--out-dir``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"surecl: error: {_bounded(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


class _Once(argparse.Action):
    """An option that may be given once (a second ``--config`` silently replaced the first);
    ``example``: the option's value in the error, where it takes a comma-separated list."""

    def __init__(self, *args, example: str | None = None, **kwargs):
        self.example = example
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, f"_{self.dest}_seen", False):
            parser.error(f"{option_string} given twice: " + (f"give one comma-separated list, e.g. {option_string} {self.example}"
                                                             if self.example else "give it once"))
        setattr(namespace, f"_{self.dest}_seen", True)
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="surecl", description="Continual learning of language models with surprise-prioritised replay.",
                epilog=_registered())
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable): code that registers methods or replay policies with "
                        "surecl.register_method / register_policy (installed packages are found through their entry points)")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="one continual run", epilog=_registered())
    r.add_argument("--config", action=_Once, example="tiny,seq_lora", help="preset names or YAML files, comma-separated, applied in order (default: slow_surprise); "
                                    "an earlier run's config.yaml runs that config again")
    r.add_argument("--out", help="output directory (default: runs/<preset>-<benchmark>-o<order>-s<seed>, then the other overrides given)")
    r.add_argument("--fresh", action="store_true",
                   help="start over in a used --out: remove exactly what the earlier run wrote there (the paths its manifest "
                        ".surecl-manifest.json lists: config.yaml, results.json, checkpoints/stage-*, adapters/fast, ...) once the new "
                        "run has loaded its data and model (a symbolic link found at one of those paths is removed, never followed); anything "
                        "else there stays, and a symbolic link or a file of yours at another path where the run writes stops it, "
                        "removing nothing. Without it a rerun continues from the newest checkpoint, or does "
                        "nothing if the run finished")
    r.add_argument("--no-resume", action="store_true", help=argparse.SUPPRESS)  # deprecated alias of --fresh
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.add_argument("--log-with", action="append", metavar="TRACKER",
                   help="also log loss, lr, buffer size and every accuracy-matrix cell to an experiment tracker: tensorboard "
                        "(events in <out>/tensorboard/; pip install surecl[tensorboard]), wandb, mlflow, ... or all (repeatable, or comma-separated)")
    r.add_argument("--dry-run", action="store_true", help="print the resolved config and the planned steps, buffer and EMA window per task; train nothing")
    r.add_argument("overrides", nargs="*", metavar="key.sub=value")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="methods x orders x seeds, skipping finished runs")
    s.add_argument("--plan", action=_Once, help="a sweep plan: a packaged name (surecl list) or a YAML file; the options below replace its values")
    s.add_argument("--methods", action=_Once, example="seq_lora,surprise", help="comma-separated method presets (default: seq_lora,reservoir,surprise,slow_surprise; with a "
                   "plan's groups: those groups' runs of these methods, a method of no group with the plan's own settings)")
    s.add_argument("--orders", action=_Once, example="1,2,3", help="comma-separated orders (default: the --config protocol preset's, e.g. lnt -> 4,5,6; else default)")
    s.add_argument("--seeds", action=_Once, example="0,1,2", help="comma-separated seeds (default 0)")
    s.add_argument("--config", action=_Once, example="paper-t5,lnt", help="presets/YAML applied to every run before the method preset (e.g. tiny)")
    s.add_argument("--out", default="runs/sweep")
    s.add_argument("--grid", action="append", default=[], metavar="key.sub=v1,v2",
                   help="ablation axis (repeatable), e.g. replay.buffer_size=150,300,500 or dual.beta=0.99,0.995")
    s.add_argument("--metric", default="fp")
    s.add_argument("--layout", choices=("orders", "paper"), default=None,
                   help="report at the end (default: the plan's, else orders): orders -> <out>/table.md/.csv; paper -> <out>/report/ (see surecl report --layout paper)")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("overrides", nargs="*", metavar="key.sub=value",
                   help="applied to every run after the plan's own overrides (which they replace); a group's overrides and grid values still decide their runs")
    s.set_defaults(func=cmd_sweep)

    rep = sub.add_parser("report", help="aggregate runs into the paper's table shape")
    rep.add_argument("dirs", nargs="+")
    rep.add_argument("--layout", choices=("orders", "paper"), default="orders",
                     help="orders (default): one table, a column per order; paper: main table with Standard CL / LNT / All "
                          "averages, forgetting table, ablations, paired claims and missing runs")
    rep.add_argument("--metric", default="fp", help="fp (default), ap, forgetting, bwt or avg_incremental")
    rep.add_argument("--csv", help="also write the (main) table as CSV")
    rep.add_argument("--md", help="also write the table (paper: the whole report) as markdown")
    rep.add_argument("--out-dir", help="paper: write report.md, main/forgetting/claims/missing .md+.csv, ablation_<key>.md/.csv/.png here")
    rep.add_argument("--no-fast", action="store_true", help="paper: hide the '<row> (fast)' rows of dual runs from the tables")
    rep.add_argument("--claims", choices=("default", "none"), default="default",
                     help="paper: the paper's claims whose rows are in the runs (default) or none")
    rep.add_argument("--claim", action="append", default=[], metavar="A>B",
                     help="paper: also test 'row A is better than row B' (repeatable; quote it)")
    rep.add_argument("--unit", choices=("auto", "seed"), default="auto",
                     help="paper: the claims' unit: auto (each (order, seed) where every run drew its own data, else the seed) or seed "
                          "(each seed's pairs averaged over its orders: a unit that stays valid where a seed's runs share random streams)")
    rep.add_argument("--order-benchmark", action="append", default=[], metavar="ORDER=BENCHMARK",
                     help="paper: count a custom order in a benchmark's average, e.g. lnt8a=LNT (orders 1-3 Standard CL, 4-6 LNT)")
    rep.set_defaults(func=cmd_report)

    ls = sub.add_parser("list", help="methods, presets, benchmarks and orders")
    ls.set_defaults(func=cmd_list)
    for command in (r, s, rep, ls):  # also accepted after the command (read by main before parsing)
        command.add_argument("--import", dest="imports", action="append", default=argparse.SUPPRESS, metavar="MODULE",
                             help="import MODULE first (repeatable), e.g. one that calls surecl.register_method")
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return p


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments, with ``key.sub=value`` overrides accepted on both sides of options
    (``run --config tiny lr=1 --dry-run seed=2``; argparse alone took the first group only)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


_PAPER_ONLY = {"out_dir": "--out-dir", "no_fast": "--no-fast", "claim": "--claim", "order_benchmark": "--order-benchmark"}


def _imports(argv: list[str]) -> list[str]:
    """The modules named by ``--import MODULE`` (or ``--import=MODULE``) anywhere before ``--``."""
    found = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--import" and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith("--import="):
            found.append(arg.split("=", 1)[1])
    return found


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while the command starts (imports, parsing), before its own handling
        print("surecl: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _FINGERPRINTS.clear()  # data may have changed since an earlier command in this process
    modules = _imports(argv)
    if modules:  # before the parser: its help lists what they register
        from surecl.registry import import_modules

        try:
            import_modules(modules)
        except SureclError as exc:
            if "--debug" in argv[: argv.index("--") if "--" in argv else len(argv)]:  # parsed after the import: read here
                raise  # with the module's own error as its cause
            print(f"surecl: error: {_bounded(str(exc))}", file=sys.stderr)
            return 2
    parser = build_parser()
    args = _parse(parser, argv)
    from surecl.logs import console

    try:
        with console(), _sigterm_as_interrupt():  # the library logs; the command shows its records as `surecl: ...` lines
            return args.func(args)
    except SureclError as exc:
        if args.debug:
            raise
        print(f"surecl: error: {_bounded(str(exc))}", file=sys.stderr)
        return 2
    except Terminated:
        print("surecl: terminated (SIGTERM); rerun the same command to resume", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("surecl: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except _out_of_memory() as exc:
        if args.debug:
            raise
        print(f"surecl: error: {_memory_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`surecl list | head`): nothing more to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OSError, _safetensors_error()) as exc:
        # safetensors reports a full disk as its own error, naming the OS error in its text
        full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
            not isinstance(exc, OSError) and re.search(r"os error (28|122)\b|No space left on device|Disk quota exceeded", str(exc)))
        if args.debug:
            raise
        if not full:
            if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
                # a path given that cannot be read or written (a folder where a file is wanted, no permission, an I/O error)
                print(f"surecl: error: {_bounded(str(exc.filename))}: {exc.strerror}", file=sys.stderr)
                return 2
            raise
        where = f" writing {_bounded(str(exc.filename))}" if getattr(exc, "filename", None) else ""
        print(f"surecl: error: no space left on the device{where}; what was written before stays intact (writes are atomic): "
              "free some space and rerun the same command to resume", file=sys.stderr)
        return 2


MAX_MESSAGE = 600
"""The most characters of an error message shown: a value quoted in one (a huge override, a
corrupt file's content) never floods the terminal."""


def _bounded(message: str) -> str:
    """``message`` on one line, cut to :data:`MAX_MESSAGE` characters."""
    line = " ".join(message.split("\n"))
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 20] + f" ... ({len(line)} chars)"


class Terminated(KeyboardInterrupt):
    """SIGTERM (what a scheduler sends on preemption), raised where the process is, as Ctrl-C is:
    temporaries are removed on the way out and the run stays resumable."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _out_of_memory() -> type[BaseException]:
    """The accelerator's out-of-memory error (a class no other exception matches without torch)."""
    torch = sys.modules.get("torch")
    return getattr(torch, "OutOfMemoryError", _NeverRaised) if torch is not None else _NeverRaised


class _NeverRaised(Exception):
    pass


def _safetensors_error() -> type[BaseException]:
    """safetensors' own error class (what its writers raise for a full disk), if it is loaded."""
    module = sys.modules.get("safetensors")
    return getattr(module, "SafetensorError", _NeverRaised) if module is not None else _NeverRaised


def _memory_line(exc: BaseException) -> str:
    from surecl.errors import start_over

    first = str(exc).splitlines()[0] if str(exc) else "out of memory"
    return (f"out of accelerator memory ({first[:160]}); the last checkpoint is intact: free the device (fewer processes on "
            f"it) and rerun the same command to resume, or start afresh ({start_over('--fresh')}, or another --out) with a lower "
            "eval.batch_size or train.micro_batch_tokens: a resume keeps the run's config")


if __name__ == "__main__":
    sys.exit(main())
