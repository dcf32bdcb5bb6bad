"""bf16 arithmetic at fp32 matmul speed, for measuring bf16 results on a CPU without bf16 matmuls.

On a CPU without AVX512-BF16/AMX, torch runs a bf16 matmul on a slow generic path (0.9 against
82-141 GFLOP/s for fp32 on an AVX2 machine, ``python matmul_rate.py``), so a ``surecl run`` with
the base in bf16 would take hours there. ``EmulatedBF16Matmuls`` routes the matrix products of
the linear layers and the output layer, forward and backward, whose operands are bf16 to the
fp32 kernel instead: it widens the bf16 operands to fp32 (exactly:
every bf16 value is an fp32 value), multiplies there (each product of two bf16 values is exact
in fp32, so the sum is an fp32 accumulation of exact products) and rounds the result to bf16.
That is the arithmetic of a bf16 matmul that accumulates in fp32 (oneDNN's AVX512-BF16
kernels: bf16 inputs, fp32 accumulation, bf16 output; cuBLAS may also reduce partly in bf16,
see ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``); only the order of
the fp32 summation differs, as it does between any two kernels. Every other operation (norms,
rotary embeddings, attention, activations, the LoRA adapters in fp32) runs unchanged, in the
dtype the model gives it. ``tests/test_bf16_emulation.py`` checks the products against torch's own bf16
kernels and a bf16 model's loss and LoRA gradients against the same model without emulation.

Usage (from the repository root):
    python bench/bf16_emulation.py run --config surprise model.dtype=bf16 --out runs/x ...
runs ``surecl`` with the emulation on; ``bash bench/fp32_parity.sh runs/parity "0 1 2" dtype``
uses it by itself where bf16 matmuls are not native.
    python bench/bf16_emulation.py check [n]
compares the emulated products of SmolLM2's shapes with torch's bf16 kernel and with float64,
then scores n (default 24) real training examples one at a time with the embedded SmolLM2 held
in bf16, with torch's bf16 matmuls and emulated, and in fp32: the per-sequence mean NLL of
each, how far they are from one another, and the time of each.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from common import load, real_items, script
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: The matrix products of a transformer's linear layers and output layer, as they reach the
#: dispatcher in a forward (``linear``, ``matmul`` under inference mode) or a backward pass.
MATMULS = frozenset(
    {
        aten.linear.default,
        aten.mm.default,
        aten.addmm.default,
        aten.bmm.default,
        aten.baddbmm.default,
        aten.matmul.default,
        aten.mv.default,
        aten.addmv.default,
    }
)


class EmulatedBF16Matmuls(TorchDispatchMode):
    """Within this mode, a product in ``MATMULS`` whose tensors are all bf16 is computed as
    bf16 -> fp32 -> product in fp32 -> rounded to bf16. ``calls`` counts the products it took
    over. Attention (SDPA) is not a product here: it runs torch's own bf16 kernel."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
        # Only products whose tensors are all bf16: a mix raises natively, and must here too.
        if func in MATMULS and tensors and all(t.dtype == torch.bfloat16 for t in tensors):
            self.calls += 1
            wide = [a.float() if torch.is_tensor(a) and a.dtype == torch.bfloat16 else a for a in args]
            wide_kwargs = {k: v.float() if torch.is_tensor(v) and v.dtype == torch.bfloat16 else v for k, v in kwargs.items()}
            return func(*wide, **wide_kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


def check(n: int) -> None:
    import statistics
    import time

    print("SmolLM2's products (rows x inner x outer), relative error against float64, and elements equal:")
    gen = torch.Generator().manual_seed(0)
    for rows_, inner, outer in [(117, 576, 576), (117, 576, 192), (117, 576, 1536), (117, 1536, 576), (117, 576, 49152)]:
        x = torch.randn(rows_, inner, generator=gen).to(torch.bfloat16)
        w = (torch.randn(outer, inner, generator=gen) / inner**0.5).to(torch.bfloat16)
        exact = x.double() @ w.double().T
        with torch.inference_mode():
            native = torch.nn.functional.linear(x, w)
            with EmulatedBF16Matmuls():
                emulated = torch.nn.functional.linear(x, w)

        def err(t, exact=exact):
            return float((t.double() - exact).norm() / exact.norm())

        print(
            f"  {rows_} x {inner} x {outer:<6d} torch bf16 {err(native):.3e}  emulated {err(emulated):.3e}  "
            f"float64 rounded once to bf16 {err(exact.to(torch.bfloat16)):.3e}  equal {float((native == emulated).double().mean()):.4%}"
        )
    print(f"per-sequence mean NLL of {n} real training examples, one at a time:")
    loaded = load("fp32")
    bf16, fp32 = load("bf16").model, loaded.model
    items = real_items(loaded.tokenizer, n)

    def nll(model, ids, mode=None):
        start = time.perf_counter()
        with mode or contextlib.nullcontext():
            logits = model(ids).logits[:, :-1].float()
        took = time.perf_counter() - start
        return -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1).mean().item(), took

    rows = []
    with torch.inference_mode():
        for item in items:
            ids = torch.tensor([item.prompt + item.answer])
            rows.append((ids.shape[1], nll(bf16, ids), nll(bf16, ids, EmulatedBF16Matmuls()), nll(fp32, ids)))
            t, (a, _), (b, _), (c, _) = rows[-1]
            print(f"  {t:4d} tokens  mean NLL: torch bf16 {a:.4f}  emulated bf16 {b:.4f}  fp32 {c:.4f}", flush=True)
    med = statistics.median
    print(f"median |emulated - torch bf16| {med(abs(r[2][0] - r[1][0]) for r in rows):.4f}, median |fp32 - torch bf16| {med(abs(r[3][0] - r[1][0]) for r in rows):.4f}, median |emulated - fp32| {med(abs(r[2][0] - r[3][0]) for r in rows):.4f}")
    print(f"median forward time: torch bf16 {med(r[1][1] for r in rows):.3f} s, emulated bf16 {med(r[2][1] for r in rows):.3f} s, fp32 {med(r[3][1] for r in rows):.3f} s")


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        check(int(argv[1]) if len(argv) > 1 else 24)
        return 0
    from surecl.cli import main as surecl_main

    print("bf16 matmuls emulated: bf16 operands, fp32 products and sums, bf16 results (bench/bf16_emulation.py)", file=sys.stderr)
    mode = EmulatedBF16Matmuls()
    with mode:
        rc = surecl_main(argv)
    print(f"bf16 matmuls emulated: {mode.calls} products", file=sys.stderr)
    return rc


if __name__ == "__main__":
    script(lambda: main(sys.argv[1:]))
