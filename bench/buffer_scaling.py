"""Buffer cost as tasks and data grow: insertion (per task) and sampling (per step).

A replay step must cost the same whatever the number of tasks or examples seen; only the
per-task insertion touches the new task's data. The online buffer (``online_surprise``) is
offered every example of the stream (two labels per task) and timed over the last 10 000
offers. Run: ``python bench/buffer_scaling.py``.
"""

from __future__ import annotations

import random
import time

from surecl.replay.buffer import Entry, OnlineQuotaBuffer, QuotaBuffer, ReservoirBuffer, sample


def main() -> None:
    rng = random.Random(0)
    print(f"{'tasks':>5} {'per task':>8} {'seen':>8} {'insert ms':>10} {'sample us':>10} {'reservoir offer us':>19} {'online offer us':>16}")
    for n_tasks, per_task in ((4, 1000), (15, 1000), (15, 10000), (100, 1000), (100, 10000)):
        buf, res = QuotaBuffer(300), ReservoirBuffer(300)
        insert = []
        for t in range(n_tasks):
            scores = [rng.random() for _ in range(per_task)]
            s = time.perf_counter()
            buf.add_task(t, scores)
            insert.append(time.perf_counter() - s)
        s = time.perf_counter()
        for _ in range(2000):
            sample(buf.entries, 32, rng)
        per_sample = (time.perf_counter() - s) / 2000
        s = time.perf_counter()
        for i in range(20000):
            res.offer(Entry(i % n_tasks, i), rng)
        per_offer = (time.perf_counter() - s) / 20000
        online, total = OnlineQuotaBuffer(300), n_tasks * per_task
        s = time.perf_counter()
        for i in range(total):
            if i == total - 10000:
                s = time.perf_counter()
            t = i // per_task
            online.offer(f"{t}:{i % 2}", Entry(t, i, rng.random()))
        per_online = (time.perf_counter() - s) / 10000
        print(f"{n_tasks:5d} {per_task:8d} {n_tasks * per_task:8d} {1e3 * sorted(insert)[len(insert) // 2]:10.3f} "
              f"{1e6 * per_sample:10.2f} {1e6 * per_offer:19.3f} {1e6 * per_online:16.3f}")


if __name__ == "__main__":
    main()
