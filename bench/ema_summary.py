"""FP slow - fast per EMA rule across the streams that ``bench/ema_window.py`` measured.

Each argument is an ``ema_window.json`` (or the folder holding it), optionally named as
``NAME=PATH``; runs of one stream length in several files (e.g. two seeds run separately) are
pooled by their steps per task under the first name given for that length. Prints one row per
rule: the mean over seeds of FP slow - fast on every stream, then the worst stream (the rule's
minimum) and the mean over streams, sorted by the minimum: the rule that is never far below the
fast adapter comes first. ``--ap``: the same for AP (accuracy on each task right after it).

Usage (from the repository root):
  python bench/ema_summary.py 15=runs/ema_window 50=runs/ema_window50 50=runs/ema_window50s1 \
      150=runs/ema_window150 embedded=runs/ema_default
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean

from surecl.errors import SureclError


def rule_name(shadow: str) -> str:
    """``"auto 0.5 task(s) (beta 0.9600)"`` -> ``"auto 0.5 task(s)"``: the beta of a window rule
    depends on the stream, the rule does not."""
    return shadow.split(" (beta")[0]


def read_streams(args: list[str], metric: str) -> dict[str, dict[str, list[float]]]:
    """Slow - fast per stream and rule, every file read before a line is printed, so a path
    that is wrong is one line naming it, not a traceback under half a table."""
    streams: dict[str, dict[str, list[float]]] = {}
    names: dict[tuple[str, int], str] = {}
    for arg in args:
        label, _, where = arg.rpartition("=")
        path = Path(where)
        try:
            path = path / "ema_window.json" if path.is_dir() else path
            entries = json.loads(path.read_text())
        except OSError as exc:
            raise SureclError(f"{path}: cannot read it ({exc.strerror or exc}); give an ema_window.json or the folder holding it") from None
        except ValueError as exc:
            raise SureclError(f"{path}: not JSON ({exc}); give an ema_window.json or the folder holding it") from None
        try:
            for entry in entries:
                key = (label or path.parent.name, entry["steps_per_task"])
                name = names.setdefault(key, f"{key[0]} ({key[1]} steps)")
                per_rule = streams.setdefault(name, {})
                for shadow, res in entry["shadows"].items():
                    per_rule.setdefault(rule_name(shadow), []).append(res[metric] - entry["fast"][metric])
        except (KeyError, TypeError, AttributeError) as exc:
            raise SureclError(f"{path}: not the records bench/ema_window.py writes ({type(exc).__name__}: {exc}); "
                              "give an ema_window.json or the folder holding it") from None
    return streams


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="an ema_window.json or the folder holding it, optionally as NAME=PATH")
    ap.add_argument("--ap", action="store_true", help="AP (accuracy on each task right after it) instead of FP")
    args = ap.parse_intermixed_args(argv)  # --ap anywhere among the paths
    metric = "ap" if args.ap else "fp"
    try:
        streams = read_streams(args.paths, metric)
    except SureclError as exc:
        print(f"{ap.prog}: error: {exc}", file=sys.stderr)
        return 2
    cols = list(streams)
    rules = sorted({r for s in streams.values() for r in s})
    rows = []
    for rule in rules:
        means = [fmean(streams[c][rule]) if rule in streams[c] else None for c in cols]
        have = [m for m in means if m is not None]
        rows.append((rule, means, min(have), fmean(have)))
    rows.sort(key=lambda r: (-r[2], -r[3]))
    print(f"{metric.upper()} slow - fast, mean over seeds")
    print("| rule | " + " | ".join(f"{c}, n={max(len(v) for v in streams[c].values())}" for c in cols) + " | min | mean |")
    print("|---" * (len(cols) + 3) + "|")
    for rule, means, lo, mean in rows:
        cells = ["" if m is None else f"{m:+.1f}" for m in means]
        print(f"| {rule} | " + " | ".join(cells) + f" | {lo:+.1f} | {mean:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
