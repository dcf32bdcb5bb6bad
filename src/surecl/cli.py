"""Command line: ``surecl run | sweep | report | list``.

Every user error is a :class:`~surecl.errors.SureclError`: one line on stderr, exit code 2, no
traceback (``--debug`` shows one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from surecl.errors import SureclError


def _out_dir(arg: str | None, cfg) -> Path:
    if arg:
        return Path(arg)
    order = cfg.data.order if not cfg.data.tasks else "custom"
    bench = Path(cfg.data.benchmark).name or "bench"
    return Path("runs") / f"{cfg.preset or cfg.method}-{bench}-o{order}-s{cfg.seed}"


def check_out_dir(out: Path) -> None:
    """Refuse output paths we cannot or must not write, before any compute is spent."""
    if out.exists() and not out.is_dir():
        raise SureclError(f"--out: {out} is a file, not a directory")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise SureclError(f"--out: {probe} is a file, not a directory")
    try:  # os.access says yes to root even on read-only file systems: try for real
        fd, tmp = tempfile.mkstemp(prefix=".surecl-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError:
        raise SureclError(f"--out: {probe} is not writable") from None


def _finished(out: Path, cfg) -> bool:
    path = out / "results.json"
    if not path.is_file():
        return False
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["config"]
    except (OSError, ValueError, KeyError):
        raise SureclError(f"{path}: exists but is not a readable results file; choose another --out") from None
    if saved != cfg.to_dict():
        raise SureclError(f"{out}: already holds a finished run with a different config; choose another --out")
    return True


def cmd_run(args) -> int:
    from surecl.config import build_config

    cfg = build_config(args.config, args.overrides)
    if args.dry_run:
        from surecl.plan import describe

        print(describe(cfg))
        return 0
    out = _out_dir(args.out, cfg)
    check_out_dir(out)
    if _finished(out, cfg):
        print(f"surecl: {out} already finished (results.json); nothing to do", file=sys.stderr)
        return 0
    from surecl.trainer import run

    results = run(cfg, out, resume=not args.no_resume, progress=not args.quiet)
    print(f"FP {results['fp']:.1f}  AP {results['ap'] if results['ap'] is None else round(results['ap'], 1)}  "
          f"forgetting {results['forgetting'] if results['forgetting'] is None else round(results['forgetting'], 1)}  -> {out}/results.json")
    return 0


def cmd_sweep(args) -> int:
    from surecl.config import build_config
    from surecl.trainer import run

    root = Path(args.out)
    check_out_dir(root)
    methods = [m for m in args.methods.split(",") if m]
    orders = [o for o in args.orders.split(",") if o]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    grid = [[]]  # ablations: every combination of --grid key=v1,v2 values
    for spec in args.grid:
        if "=" not in spec:
            raise SureclError(f"--grid {spec!r} must look like key.sub=v1,v2")
        key, values = spec.split("=", 1)
        grid = [g + [f"{key}={v}"] for g in grid for v in values.split(",") if v]
    plan = []
    for method in methods:
        for point in grid:
            # the table row: the preset, plus the grid values when there is a grid
            row = " ".join([method, *point])
            for order in orders:
                for seed in seeds:
                    overrides = list(args.overrides) + point + [f"data.order={order}", f"seed={seed}", f"preset={row}"]
                    cfg = build_config(f"{args.config},{method}" if args.config else method, overrides)
                    plan.append((cfg, root / "/".join([method, *point]) / f"order{order}" / f"seed{seed}"))
    for k, (cfg, out) in enumerate(plan, 1):
        if _finished(out, cfg):
            print(f"[{k}/{len(plan)}] {out}: finished, skipped", file=sys.stderr)
            continue
        print(f"[{k}/{len(plan)}] {out}", file=sys.stderr)
        run(cfg, out, resume=True, progress=not args.quiet)
    return cmd_report(argparse.Namespace(dirs=[str(root)], metric=args.metric, csv=str(root / "table.csv"), md=str(root / "table.md")))


def cmd_report(args) -> int:
    from surecl.checkpoint import write_text
    from surecl.report import aggregate, find_runs, table_csv, table_markdown

    runs = find_runs([Path(d) for d in args.dirs])
    if args.metric not in ("fp", "ap", "forgetting", "bwt", "avg_incremental"):
        raise SureclError(f"--metric: unknown metric {args.metric!r}")
    orders, rows = aggregate(runs, args.metric)
    md = table_markdown(orders, rows, args.metric, runs[0].get("metric", "accuracy"))
    print(md)
    if args.csv:
        write_text(Path(args.csv), table_csv(orders, rows))
    if args.md:
        write_text(Path(args.md), md)
    return 0


def cmd_list(args) -> int:
    from surecl.config import load_yaml, preset_names
    from surecl.data.cl_benchmark import BENCHMARK_OF_ORDER, ORDERS
    from surecl.methods import METHODS
    from surecl.replay.policies import POLICIES

    print("methods:  " + ", ".join(sorted(METHODS)))
    print("replay:   " + ", ".join(POLICIES))
    print("presets:")
    for name in preset_names():
        data, _ = load_yaml(name)
        print(f"  {name:16s} {data.get('description', '')}")
    print("benchmarks: embedded (offline default, 4 tasks), tiny (fixture), or a CL_Benchmark folder path")
    print("orders:")
    for k, tasks in ORDERS.items():
        print(f"  {k} ({BENCHMARK_OF_ORDER[k]}): {', '.join(tasks)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="surecl", description="Continual learning of language models with surprise-prioritised replay.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="one continual run")
    r.add_argument("--config", help="preset name or YAML file (default: slow_surprise)")
    r.add_argument("--out", help="output directory (default: runs/<preset>-<benchmark>-o<order>-s<seed>)")
    r.add_argument("--no-resume", action="store_true", help="ignore checkpoints in --out")
    r.add_argument("--resume", action="store_true", help="continue a killed run (the default when --out holds checkpoints)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.add_argument("--dry-run", action="store_true", help="print the resolved config and the planned steps, buffer and EMA window per task; train nothing")
    r.add_argument("overrides", nargs="*", metavar="key.sub=value")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="methods x orders x seeds, skipping finished runs")
    s.add_argument("--methods", default="seq_lora,reservoir,surprise,slow_surprise", help="comma-separated presets")
    s.add_argument("--orders", default="default")
    s.add_argument("--seeds", default="0")
    s.add_argument("--config", help="presets/YAML applied to every run before the method preset (e.g. tiny)")
    s.add_argument("--out", default="runs/sweep")
    s.add_argument("--grid", action="append", default=[], metavar="key.sub=v1,v2",
                   help="ablation axis (repeatable), e.g. replay.buffer_size=150,300,500 or dual.beta=0.99,0.995")
    s.add_argument("--metric", default="fp")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("overrides", nargs="*", metavar="key.sub=value")
    s.set_defaults(func=cmd_sweep)

    rep = sub.add_parser("report", help="aggregate runs into the paper's table shape")
    rep.add_argument("dirs", nargs="+")
    rep.add_argument("--metric", default="fp")
    rep.add_argument("--csv", help="also write the table as CSV")
    rep.add_argument("--md", help="also write the table as markdown")
    rep.set_defaults(func=cmd_report)

    ls = sub.add_parser("list", help="methods, presets, benchmarks and orders")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SureclError as exc:
        if args.debug:
            raise
        print(f"surecl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("surecl: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
