"""Evaluation without surecl's evaluator: greedy ``generate`` one prompt at a time on a model
loaded with plain transformers / PEFT, scored with surecl's normalised exact match. Tests of
saved adapters and models use it to show that what was saved reproduces the run's row."""

from __future__ import annotations

import torch

from surecl.data.encode import TaskEncoder
from surecl.evaluate import accuracy


def greedy_row(model, tok, tasks, max_length: int) -> list[float]:
    """Accuracy (percent) of ``model`` on each task's test split, decoded greedily."""
    encoder = TaskEncoder(tok, max_length)
    row = []
    for t in tasks:
        items = encoder.encode(t, t.test)
        new_tokens = max(len(encoder.answer_ids(lab)) for lab in t.labels) + 1
        preds = []
        for e in items:
            ids = torch.tensor([e.prompt])
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                )
            preds.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
        row.append(accuracy(preds, [e.label for e in items]))
    return row
