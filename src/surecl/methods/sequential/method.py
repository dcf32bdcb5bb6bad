"""Sequential LoRA fine-tuning: one stage per task, in stream order (SeqLoRA; with a replay
policy and/or the dual learner it becomes ER, SuRe, Slow SuRe...)."""

from surecl.methods.base import Method


class Sequential(Method):
    name = "sequential"
