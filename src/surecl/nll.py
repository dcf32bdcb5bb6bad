"""Per-example negative log-likelihood: the one forward used for training, surprise and ranking.

Returns, for each row of a collated batch, the summed NLL and the number of tokens scored, so
callers choose the reduction (mean = the paper's surprise, sum = its ablation) and scope
(``label``: answer tokens only; ``sequence``: every real token after the first).
"""

from __future__ import annotations

import torch


def token_nll(model, batch: dict[str, torch.Tensor], scope: str = "label", is_seq2seq: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL and token count per row (fp32), for causal (left-padded) or seq2seq batches."""
    if is_seq2seq:
        labels = batch["labels"]
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels, use_cache=False)
        logits, targets = out.logits, labels.clamp(min=0)
        valid = (labels != -100).float()
    elif scope == "label":
        ids, mask = batch["input_ids"], batch["attention_mask"]
        # Answers end at the last position (left padding): keep logits for the last k+1 positions.
        k = int(batch["n_answer"].max())
        out = model(input_ids=ids, attention_mask=mask, position_ids=batch["position_ids"], use_cache=False, logits_to_keep=k + 1)
        logits = out.logits[:, -(k + 1) : -1]
        targets = ids[:, ids.shape[1] - k :]
        offsets = torch.arange(k, device=ids.device).unsqueeze(0)
        valid = (offsets >= (k - batch["n_answer"].to(ids.device)).unsqueeze(1)).float()
    else:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        out = model(input_ids=ids, attention_mask=mask, position_ids=batch["position_ids"], use_cache=False)
        logits = out.logits[:, :-1]
        targets = ids[:, 1:]
        valid = (mask[:, 1:] * mask[:, :-1]).float()
    # NLL = logsumexp(logits) - logit[target], in fp32 a few rows at a time: a whole-sequence
    # batch of fp32 logits over a large vocabulary would cost gigabytes (32 x 128 x 49k floats
    # = 0.8 GB), and logsumexp reads the logits without writing a log-softmax of the same size
    # (2.4x faster than cross_entropy over the vocabulary axis here, bench/scoring.py).
    parts = []
    for r in range(0, logits.shape[0], 4):
        chunk = logits[r : r + 4]
        target_logit = chunk.gather(2, targets[r : r + 4].unsqueeze(2)).squeeze(2).float()
        parts.append(torch.logsumexp(chunk.float(), dim=-1) - target_logit)
    nll = torch.cat(parts)
    return (nll * valid).sum(1), valid.sum(1)
