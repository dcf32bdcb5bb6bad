"""The exit handler of several-process runs (:mod:`surecl.processes`): a run's objects left in a
reference cycle are freed while the process group is still up, before the group is destroyed,
not in interpreter finalisation after it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from test_two_process import free_port


def test_a_cycle_left_at_exit_is_freed_before_the_group_goes(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys
        import torch.distributed as dist
        from surecl.processes import release_at_exit

        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        release_at_exit()

        class Held:  # stands for a run holding its DDP model: freed only by a collection
            def __del__(self):
                with open({str(tmp_path / "freed")!r}, "w") as f:
                    f.write("group up" if dist.is_initialized() else "group down")

        held = Held()
        held.me = held
        del held
        print("group up at the end:", dist.is_initialized())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "group up at the end: True" in done.stdout
    assert (tmp_path / "freed").read_text() == "group up"  # freed by the handler's collection, before the group went
