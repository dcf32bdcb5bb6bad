"""Settings shared by the tests that need the tiny model to learn a task.

At the tiny preset's 8 epochs a seed's first task lands at 75-100 % depending on the CPU's
kernels. 12 epochs learned every seed 0-4 on two AVX512-BF16 machines but not on an AMD EPYC
with AVX2 only: 3 of 30 (task, seed) runs below 90 % there (seed 0 on colors: 25 %). At 16
epochs all 30 cleared 90 % on it (lowest 95.8 %), and the tests' multi-task assertions held;
20 epochs overtrains the second task of some runs. With seeds 3-5 in place of the tests'
0-2 (a stand-in for another CPU's rounding) every multi-task assertion held at 16 too.
On an AMD EPYC with AVX512-BF16 (no AMX) at 16 epochs every first task was learned, but three
multi-task assertions that held elsewhere did not (a seed's SeqLoRA kept one earlier task at
chance; O-LoRA kept no more than SeqLoRA by rank; MTL missed a task at one thread): the
outcome tests now bound what holds over seeds 0-5 on every CPU measured, with room for a
chaotic seed. Rerun: bench/tiny_learning.py (one task) and bench/tiny_outcomes.py (the
multi-task quantities the tests assert)."""

LEARNED = "train.epochs=16"
