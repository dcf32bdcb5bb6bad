"""Per-example negative log-likelihood: the one forward used for training, surprise and ranking.

A causal batch may carry a shared prompt prefix (``prefix_ids``, see ``collate``): it then
runs once and the rows attend to its KV cache; the result is the same as for the whole rows,
except where the model places something by the keys' index in the padded batch, where a row's
left padding sits after the prefix: a sliding window shorter than the rows span, GPT-Neo's
local layers, MPT's ALiBi bias; a run turns ``model.share_prefix`` off for such a model
(:func:`shared_prefix_obstacle`; :func:`prefix_sharing` for a direct call).
Without one, on an accelerator in training, the left padding's positions attend to themselves
(:func:`pad_self_mask`) rather than to nothing, where the model takes a 4D mask
(:func:`takes_pad_self_mask`).

Returns, for each row of a collated batch, the summed NLL and the number of tokens scored, so
callers choose the reduction (mean = the paper's surprise, sum = its ablation) and scope
(``label``: answer tokens only, those its ``answer_mask`` marks where the batch has one (a
chat row's assistant turns; on a seq2seq model the ``-100`` of its ``labels``, the decoder
still reading the unscored turns, :func:`seq2seq_inputs`); ``sequence``: every real token
after the first). Virtual tokens (negative ids: a method's soft prompt, see
:meth:`surecl.methods.Method.input_prefix`) are read, never scored.
"""

from __future__ import annotations

import torch


def token_nll(model, batch: dict[str, torch.Tensor], scope: str = "label", is_seq2seq: bool = False,
              pads_self: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL and token count per row (fp32), for causal (left-padded) or seq2seq batches.

    ``pads_self``: a left-padded causal batch without a shared prefix runs with a 4D mask in
    which each pad position attends to itself alone (:func:`pad_self_mask`), so no query row
    of the attention is fully masked; the real positions' results are the same. None (the
    default, :func:`pads_self_default`): on an accelerator while gradients are recorded, where
    fused attention kernels were seen to give a non-finite gradient from such rows (RESULTS.md
    §9); the CPU keeps the plain mask, and so the results its runs had."""
    if is_seq2seq:
        labels = batch["labels"]
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels, use_cache=False,
                    **seq2seq_inputs(model, batch))
        return _rows_nll(out.logits, labels.clamp(min=0), (labels != -100).float())
    if scope == "label":
        ids = batch["input_ids"]
        kwargs, _ = prefixed(model, batch, want_logits=False, pads_self=pads_self)
        # Answers end at the last position (left padding): keep logits for the last k+1 positions.
        k = int(batch["n_answer"].max())
        out = model(input_ids=ids, position_ids=batch["position_ids"], use_cache=False, logits_to_keep=k + 1, **kwargs)
        logits = out.logits[:, -(k + 1) : -1]
        targets = ids[:, ids.shape[1] - k :]
        offsets = torch.arange(k, device=ids.device).unsqueeze(0)
        valid = (offsets >= (k - batch["n_answer"].to(ids.device)).unsqueeze(1)).float()
        if "answer_mask" in batch:  # a conversation's user turns between assistant turns: read, not scored
            valid = valid * batch["answer_mask"].to(valid.device)
    else:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        kwargs, prefix_logits = prefixed(model, batch, want_logits=True, pads_self=pads_self)
        out = model(input_ids=ids, position_ids=batch["position_ids"], use_cache=False, **kwargs)
        logits = out.logits[:, :-1]
        # Virtual tokens (negative ids, a method's soft prompt) are attended to but never scored:
        # neither as a target nor as the predecessor of a target, so a row scores the same real
        # tokens (every one after its first) with or without them.
        real = mask * (ids >= 0)
        targets = ids[:, 1:].clamp(min=0)
        valid = (real[:, 1:] * real[:, :-1]).float()
        if prefix_logits is not None:
            # The shared prefix's own tokens (the same NLL for every row) and each row's first
            # token, which the prefix's last position predicts.
            prefix = batch["prefix_ids"][0]
            lse = torch.logsumexp(prefix_logits.float(), dim=-1)
            pairs = ((prefix[1:] >= 0) & (prefix[:-1] >= 0)).float()
            own = ((lse[:-1] - prefix_logits[:-1].gather(1, prefix[1:, None].clamp(min=0)).squeeze(1).float()) * pairs).sum()
            first = ids.gather(1, (mask == 0).sum(1, keepdim=True)).squeeze(1)
            at_edge = ((first >= 0) & (prefix[-1] >= 0)).float()
            edge = (lse[-1] - prefix_logits[-1, first.clamp(min=0)].float()) * at_edge
            nll, count = _rows_nll(logits, targets, valid)
            return nll + own + edge, count + pairs.sum() + at_edge
    return _rows_nll(logits, targets, valid)


def seq2seq_inputs(model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The decoder's input for a seq2seq batch whose ``labels`` hide read-only tokens (a
    conversation's user turns, -100 in ``labels``): ``decoder_input_ids``, the batch's
    ``decoder_targets`` (every answer token) shifted right by the model's own shift (its
    ``decoder_start_token_id`` first, -100 padding read as its pad token), so the decoder reads
    those turns while the loss skips them. {} for a batch without ``decoder_targets``: the model
    then shifts ``labels`` itself, as it always did."""
    targets = batch.get("decoder_targets")
    if targets is None:
        return {}
    inner = getattr(model, "module", model)  # DDP's wrapper forwards no attributes; PEFT's does
    shift = getattr(inner, "prepare_decoder_input_ids_from_labels", None)
    if shift is not None:
        return {"decoder_input_ids": shift(labels=targets)}
    config = inner.config
    out = targets.new_full(targets.shape, config.pad_token_id)
    out[:, 1:] = targets[:, :-1].masked_fill(targets[:, :-1] == -100, config.pad_token_id)
    out[:, 0] = config.decoder_start_token_id
    return {"decoder_input_ids": out}


def pad_self_mask(mask: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The 4D attention mask [rows, 1, L, L] of a left-padded batch (``mask`` [rows, L], 1 for a
    real token) in which a real position attends to the real positions up to it, as the plain
    causal padding mask has it, and a pad position attends to itself alone instead of to
    nothing. A fully masked query row is what some fused attention kernels turn into NaN in the
    backward pass (a softmax over no keys); the pad positions' outputs are never scored.

    ``dtype`` None: boolean (True = attend; what SDPA takes for any query dtype, one byte an
    element); a float dtype: additive (0 or that dtype's lowest value), for eager attention,
    which adds the mask to its scores."""
    n = mask.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()[None] & mask.bool()[:, None, :]
    allowed.diagonal(dim1=1, dim2=2).fill_(True)
    if dtype is None:
        return allowed[:, None]
    out = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return out.masked_fill_(allowed, 0)[:, None]


def pads_self_here(mask: torch.Tensor) -> bool:
    """Whether a batch on ``mask``'s device takes :func:`pad_self_mask` in training: off the CPU."""
    return mask.device.type != "cpu"


def pads_self_default(mask: torch.Tensor) -> bool:
    """Whether :func:`prefixed` gives pads a self-attending mask when not told: off the CPU
    (:func:`pads_self_here`), and only where gradients are recorded (the fault is in the
    backward pass; evaluation and scoring keep the plain mask, and so the scores they gave)."""
    return pads_self_here(mask) and torch.is_grad_enabled()


def _sliding_window(config) -> int | None:
    """A sliding-window model's window (its own config's, or its text model's), else None."""
    for c in (config, getattr(config, "text_config", None)):
        window = getattr(c, "sliding_window", None)
        if _whole(window):
            return window
    return None


def takes_pad_self_mask(config, width: int) -> bool:
    """Whether a model with ``config`` reads :func:`pad_self_mask` for a batch ``width`` tokens
    wide as it reads the 2D mask: not where it builds something else from the 2D mask itself,
    which a 4D one breaks (BLOOM's and Falcon's ``alibi=True`` ALiBi bias, a position per real
    key: "too many values to unpack"), nor for rows longer than a sliding-window model's
    window, whose layers build a banded mask of their own from the 2D one. The one place this
    is decided; such a model keeps the plain mask."""
    if config is None:
        return False
    if getattr(config, "model_type", None) == "bloom" or getattr(config, "alibi", False) is True:
        return False
    window = _sliding_window(config)
    return window is None or width <= window


def prefixed(model, batch: dict[str, torch.Tensor], want_logits: bool, pads_self: bool | None = None) -> tuple[dict, torch.Tensor | None]:
    """Keyword arguments for the rows' forward; with ``prefix_ids`` in the batch, the shared
    prefix runs once (batch 1) and its KV cache, repeated per row, is what the rows attend to.

    The rows' attention mask is the prefix's ones followed by their own (left-padded) mask.
    Gradients flow through the repeated cache back into the one prefix pass, so a training
    step through a shared prefix computes the same gradient as running every row whole (not
    under a sliding window the rows outspan; see the module docstring).
    Without a prefix, ``pads_self`` (default :func:`pads_self_default`) gives a padded batch
    the 4D :func:`pad_self_mask` instead of its 2D mask (boolean for SDPA, additive in the
    embeddings' dtype for eager attention; other kernels, and the models
    :func:`takes_pad_self_mask` excludes, keep it).
    Returns the kwargs and, if ``want_logits``, the prefix's logits [P, V] (else None)."""
    mask = batch["attention_mask"]
    prefix = batch.get("prefix_ids")
    if prefix is None:
        if pads_self is None:
            pads_self = pads_self_default(mask)
        if pads_self and not bool(mask.all()):
            inner = getattr(model, "module", model)  # DDP's wrapper forwards no attributes; PEFT's does
            config = getattr(inner, "config", None)
            if takes_pad_self_mask(config, mask.shape[1]):
                impl = getattr(config, "_attn_implementation", None)
                if impl == "sdpa":
                    return {"attention_mask": pad_self_mask(mask)}, None
                if impl == "eager":
                    return {"attention_mask": pad_self_mask(mask, inner.get_input_embeddings().weight.dtype)}, None
            # other kernels (flash attention: a 2D padding mask; flex: its block mask) take the plain mask
        return {"attention_mask": mask}, None
    pre = model(input_ids=prefix, use_cache=True, logits_to_keep=0 if want_logits else 1)
    cache = pre.past_key_values
    cache.batch_repeat_interleave(mask.shape[0])
    full = torch.cat([mask.new_ones(mask.shape[0], prefix.shape[1]), mask], 1)
    return {"attention_mask": full, "past_key_values": cache}, (pre.logits[0] if want_logits else None)


def _rows_nll(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL and token count per row: ``valid``-weighted ``logsumexp(logits) - logit[target]``."""
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

def prefix_sharing(model, asked: bool = True) -> bool:
    """Whether a batch for ``model`` may split off its shared prompt prefix: as ``asked``, except
    for a model that places something by the keys' index in the padded batch
    (:func:`shared_prefix_obstacle`), whose rows run whole. A run decides this once
    (``build_run``, with a note); the evaluation and scoring functions called directly ask here."""
    if not asked:
        return False
    inner = getattr(model, "module", model)  # DDP forwards no attributes; PEFT forwards config
    config = getattr(inner, "config", None)
    return config is None or shared_prefix_obstacle(config) is None


def shared_prefix_obstacle(config) -> str | None:
    """Why a causal model's rows cannot share a prompt prefix, or None where they can.

    With ``model.share_prefix`` a row's left padding sits between the shared prefix and the
    row's own tokens. A model that places something by the keys' indices in the batch, not by
    ``position_ids`` or the attention mask, then sees the prefix as many positions further away
    as the row has pads (the batch it is in): a sliding window shorter than the positions
    (:func:`sliding_window_in_use`: prefix tokens inside the true window masked), and an ALiBi
    bias by key index (:func:`alibi_by_index`, MPT: every prefix token's bias moved). Whole
    left-padded rows are batch-invariant under both. BLOOM's and Falcon's ALiBi counts the
    real keys of the mask, so the shared prefix stays."""
    window = sliding_window_in_use(config)
    if window is not None:
        return f"its attention's sliding window ({window} tokens, shorter than its positions) is placed by index in the padded batch"
    if alibi_by_index(config):
        return "its ALiBi bias is placed by the keys' index in the padded batch"
    return None


def alibi_by_index(config) -> bool:
    """Whether a model's ALiBi bias is placed by the keys' index in the batch (MPT's
    ``attn_config.alibi``; a dict in a remote-code config) rather than by the real keys its
    attention mask counts (BLOOM, Falcon's ``alibi``)."""
    attn = getattr(config, "attn_config", None)
    alibi = attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", None)
    return alibi is True


def sliding_window_in_use(config) -> int | None:
    """The sliding window a causal model's attention uses where it is shorter than the model's
    positions (``n_positions`` / ``max_position_embeddings``; or none known), else None: its
    own config's ``sliding_window`` or its text model's (Gemma-3), unless ``use_sliding_window``
    is false (Qwen2) or ``layer_types`` names no ``sliding_attention`` layer (Gemma-2/3 name
    some; Mistral has no ``layer_types``: every layer); GPT-Neo's ``window_size`` where
    ``attention_layers`` names a ``local`` layer.

    transformers places that window by the keys' indices in the batch, not by ``position_ids``.
    With ``model.share_prefix`` a row's left padding sits between the shared prefix and the
    row's own tokens, so a row with k pads would see the prefix k positions further away than
    it is, and once prefix and row span more than the window, prefix tokens inside the true
    window would be masked by how many pads the row has (the batch it is in).
    :func:`surecl.run_setup.build_run` turns the shared prefix off for such a model, and
    :func:`prefix_sharing` for a direct call (whole left-padded rows are batch-invariant).
    A window no shorter than the positions never cuts a row that fits them (what
    :func:`check_context` checks), so such a model keeps the shared prefix."""
    for c in (config, getattr(config, "text_config", None)):
        window = getattr(c, "sliding_window", None)
        if not _whole(window) and "local" in (getattr(c, "attention_layers", None) or ()):
            window = getattr(c, "window_size", None)  # GPT-Neo's local layers
        if not _whole(window) or window <= 0:
            continue
        if getattr(c, "use_sliding_window", True) is False:
            continue
        layer_types = getattr(c, "layer_types", None)
        if layer_types is not None and "sliding_attention" not in layer_types:
            continue
        positions = model_positions(c)
        if positions is not None and window >= positions:
            continue
        return window
    return None


def _whole(value) -> bool:
    """Whether ``value`` is an int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def model_positions(config) -> int | None:
    """The positions a model config gives (``n_positions`` / ``max_position_embeddings``), or
    None where it names no positive whole number."""
    positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return positions if _whole(positions) and positions > 0 else None
