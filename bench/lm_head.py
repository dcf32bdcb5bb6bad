"""The output layer on a strided slice vs a contiguous copy of the same rows.

``logits_to_keep`` hands the vocabulary projection ``hidden[:, -k:, :]``, a strided view.
On CPU, ``linear`` on a strided 3-D bf16 view takes a batched-matmul path that materialises
the weight once per row; surecl's model loader makes the input contiguous first
(``surecl.model._contiguous_input``). Prints time and peak RSS growth (MiB) of both.
Run: ``python bench/lm_head.py``.
"""

from __future__ import annotations

import threading
import time

import psutil
import torch


def main() -> None:
    proc, peak = psutil.Process(), [0]

    def watch() -> None:
        while True:
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.001)

    threading.Thread(target=watch, daemon=True).start()
    vocab, hidden = 49152, 576  # SmolLM2-135M
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(vocab, hidden).to(dtype)
        h = torch.randn(32, 128, hidden).to(dtype)
        for k in (1, 4):
            for name, x in (("strided view", h[:, -k:, :]), ("contiguous", h[:, -k:, :].contiguous())):
                time.sleep(0.05)
                base, peak[0] = proc.memory_info().rss, 0
                start = time.perf_counter()
                with torch.inference_mode():
                    torch.nn.functional.linear(x, w)
                took = time.perf_counter() - start
                time.sleep(0.05)
                print(f"{str(dtype):15} last {k} of 32x128  {name:12}  {1e3 * took:8.1f} ms  peak +{(peak[0] - base) / 2**20:7.0f} MiB")


if __name__ == "__main__":
    main()
