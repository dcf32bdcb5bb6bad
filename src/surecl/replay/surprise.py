"""Surprise s(z): the NLL of a sequence under the current model, batched and length-sorted.

Scoring runs under ``torch.inference_mode`` on batches sorted by length (little padding), with
whatever dtype the frozen base is held in. ``reduction`` ``mean`` is the paper's score (mean
token NLL); ``sum`` its ablation. ``scope`` ``sequence`` scores prompt and answer, ``label``
the answer only. An encoder-decoder model predicts only its decoder side: for ``label`` the
decoder scores the answer given the prompt; for ``sequence`` it scores the whole example
(prompt tokens, then answer tokens) as its target from an empty encoder input (the answer's
end-of-sequence token alone), i.e. the model's surprise at the full sequence, as a language
model (:func:`as_full_sequence`). ``input`` is the paper's reference code's score: the
model's NLL of its own input as the target (on a causal model the whole sequence, as
``sequence``; on an encoder-decoder the decoder reconstructing the prompt,
:func:`as_input_reconstruction`). With ``share_prefix`` the prompt prefix that a
batch's rows share (a task's instruction and options) runs once per batch (``surecl.nll``).
"""

from __future__ import annotations

import torch

from surecl.data.encode import Encoded, collate
from surecl.nll import prefix_sharing, token_nll


@torch.inference_mode()
def score_examples(
    model,
    items: list[Encoded],
    *,
    pad_id: int,
    is_seq2seq: bool,
    scope: str = "sequence",
    reduction: str = "mean",
    batch_size: int = 32,
    device: torch.device | None = None,
    share_prefix: bool = True,
    eos_id: int | None = None,
) -> list[float]:
    """Surprise of every item, in the items' order (``eos_id``: the tokenizer's end-of-sequence
    token, which an encoder-decoder's ``sequence`` scope puts alone on the encoder side)."""
    if is_seq2seq and scope == "sequence":
        items = [as_full_sequence(e, eos_id) for e in items]
    elif is_seq2seq and scope == "input":
        items = [as_input_reconstruction(e) for e in items]
    if scope == "input":
        scope = "label" if is_seq2seq else "sequence"  # a causal model's input is prompt + answer: the whole sequence
    order = sorted(range(len(items)), key=lambda i: len(items[i]))
    scores = [0.0] * len(items)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = collate([items[i] for i in idx], pad_id, is_seq2seq, share_prefix=prefix_sharing(model, share_prefix))
        if device is not None:
            batch = {k: v.to(device) for k, v in batch.items()}
        nll, count = token_nll(model, batch, scope=scope, is_seq2seq=is_seq2seq)
        values = nll / count.clamp(min=1) if reduction == "mean" else nll
        for i, v in zip(idx, values.tolist()):
            scores[i] = v
    return scores


def as_full_sequence(e: Encoded, eos_id: int | None = None) -> Encoded:
    """An encoder-decoder example rewritten so its decoder target is the whole sequence:
    encoder input = the end-of-sequence token alone (``eos_id``; without it the answer's last
    token, which ends every answer not cut to ``max_length``), target = prompt + answer, the
    prompt without the end-of-sequence token an encoder input ends with (``model.encoder_eos``):
    one sequence has one end. Virtual tokens leading the prompt (a method's soft prompt,
    negative ids) stay on the encoder side, before that token: the decoder only ever predicts
    real ones."""
    eos = e.answer[-1] if eos_id is None else eos_id
    n = 0
    while n < len(e.prompt) and e.prompt[n] < 0:
        n += 1
    body = e.prompt[n:]
    if body and body[-1] == eos:
        body = body[:-1]
    return Encoded(e.prompt[:n] + [eos], body + e.answer, e.label)


def as_input_reconstruction(e: Encoded) -> Encoded:
    """``replay.scope=input`` on an encoder-decoder: the paper's reference scoring (``get_ll`` in
    ``HHazard2002/continual-learning``, ``methods/buffer.py``), ``model(input_ids=x, labels=x)``
    with the first label masked, where x is the encoder input (the prompt; the answer is not
    in it): the decoder's mean NLL of reconstructing the prompt from the encoder's copy of it.
    The masked first label is -100, which the model's right shift also turns into the pad
    token at the decoder's input, as there. Virtual tokens (negative ids) stay on the encoder
    side and are not targets."""
    real = [t for t in e.prompt if t >= 0]
    return Encoded(list(e.prompt), [-100] + real[1:], e.label)
