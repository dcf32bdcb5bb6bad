"""This CPU's square-matmul rate in fp32 and bf16, measured now in one process: tells whether
bf16 is native here (AVX512-BF16/AMX) and so which dtype ``model.dtype=auto`` will take.

Usage: cd bench && python matmul_rate.py
"""

from __future__ import annotations

import torch
from common import matmul_rate

from surecl.model import bf16_supported

if __name__ == "__main__":
    for dtype in (torch.float32, torch.bfloat16):
        print(f"{str(dtype):16s} {matmul_rate(dtype) / 1e9:8.1f} GFLOP/s (1024^3)")
    print("native bf16:", bf16_supported(torch.device("cpu")), "-> model.dtype=auto holds the base in", "bf16" if bf16_supported(torch.device("cpu")) else "fp32")
