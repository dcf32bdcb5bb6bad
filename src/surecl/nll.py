"""Per-example negative log-likelihood: the one forward used for training, surprise and ranking.

Returns, for each row of a collated batch, the summed NLL and the number of tokens scored, so
callers choose the reduction (mean = the paper's surprise, sum = its ablation) and scope
(``label``: answer tokens only; ``sequence``: every real token after the first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_nll(model, batch: dict[str, torch.Tensor], scope: str = "label", is_seq2seq: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL and token count per row (fp32), for causal (left-padded) or seq2seq batches."""
    if is_seq2seq:
        labels = batch["labels"]
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels, use_cache=False)
        logits = out.logits.float()
        nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        valid = (labels != -100).to(nll.dtype)
        return (nll * valid).sum(1), valid.sum(1)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    width = ids.shape[1]
    if scope == "label":
        # Answers end at the last position (left padding): keep logits for the last k+1 positions.
        k = int(batch["n_answer"].max())
        out = model(input_ids=ids, attention_mask=mask, position_ids=batch["position_ids"], use_cache=False, logits_to_keep=k + 1)
        logits = out.logits[:, -(k + 1) : -1].float()
        targets = ids[:, width - k :]
        offsets = torch.arange(k, device=ids.device).unsqueeze(0)
        valid = (offsets >= (k - batch["n_answer"].to(ids.device)).unsqueeze(1)).to(logits.dtype)
    else:
        out = model(input_ids=ids, attention_mask=mask, position_ids=batch["position_ids"], use_cache=False)
        logits = out.logits[:, :-1].float()
        targets = ids[:, 1:]
        valid = (mask[:, 1:] * mask[:, :-1]).to(logits.dtype)
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return (nll * valid).sum(1), valid.sum(1)
