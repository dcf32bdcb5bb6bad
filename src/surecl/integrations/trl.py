"""SuRe in your own TRL ``SFTTrainer`` script: :class:`SureSFTTrainer` (``pip install "surecl[trl]"``).

``SureSFTTrainer`` is :class:`surecl.integrations.transformers.SureTrainer` on top of TRL's
``SFTTrainer``: give it your base model, ``SFTConfig``, tokenizer (``processing_class``) and a
:class:`~surecl.integrations.transformers.SureArguments`, then call ``next_task(dataset)`` once
per task with the task's *raw* SFT dataset (``messages`` chat rows, ``prompt``/``completion``
rows, conversational or not, or ``text``). Each task's dataset goes through ``SFTTrainer``'s
own preparation (chat template, EOS, tokenisation, the labels of ``completion_only_loss`` and
``assistant_only_loss``, truncation to ``max_length``); everything after that is
``SureTrainer``'s: the surprise of an example is its mean NLL over the tokens its ``labels``
mark, i.e. the tokens the SFT loss trains on (the completion, or the assistant turns), the
buffer, the replay ratio, the slow adapter's EMA, ``evaluate`` on the slow adapter, the
checkpoints with exact resume, and training under several processes (``accelerate launch`` /
torchrun: each step's rows split across processes, scoring sharded and gathered).

Not supported, refused in one line: ``packing`` and ``padding_free`` (both merge examples
into shared rows; the buffer scores and replays whole examples), a ``peft_config`` (the
trainer puts its own fast/slow LoRA on the model: set LoRA through ``SureArguments``), a
``train_dataset`` at construction (pass each task's to ``next_task``), a model given by name,
iterable and vision datasets.

Without trl installed, ``from surecl.integrations.trl import SureSFTTrainer`` raises a
one-line :class:`~surecl.errors.SureclError` naming the extra.
"""

from __future__ import annotations

from surecl.errors import SureclError
from surecl.integrations.transformers import SureArguments

EXTRA = 'pip install "surecl[trl]"'
_CLASS = None


def _trl_missing(err: BaseException) -> SureclError:
    return SureclError(f"surecl.integrations.trl needs TRL, which is not installed ({EXTRA}): {err}".splitlines()[0])


def _placeholder():
    """A one-row, already tokenised dataset for ``SFTTrainer.__init__`` (which requires a
    ``train_dataset`` and reads its first row for format decisions): conversational, so
    ``assistant_only_loss`` passes its check. Not prompt/completion: ``completion_only_loss``
    left to SFTTrainer's default is decided for each dataset from its own format when it is
    prepared (``SureSFTTrainer._prepare_dataset``), not from this row."""
    import datasets

    turn = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    return datasets.Dataset.from_dict({"input_ids": [[0]], "messages": [turn]})


def _is_prompt_completion(sample) -> bool:
    """SFTTrainer's test for its ``completion_only_loss`` default: a prompt/completion row (or
    one TRL already tokenised from such a row, which carries its ``completion_mask``)."""
    return isinstance(sample, dict) and (("prompt" in sample and "completion" in sample) or "completion_mask" in sample)


def _build():
    try:
        import datasets
        from trl import SFTConfig, SFTTrainer
        from trl.data_utils import is_conversational
    except ImportError as err:
        raise _trl_missing(err) from None

    from surecl.integrations.transformers import SureTrainer

    class SureSFTTrainer(SureTrainer, SFTTrainer):
        """TRL's ``SFTTrainer`` with SuRe (a surprise replay buffer and a slow LoRA adapter).

        ``model`` is the frozen base (a loaded transformers model), ``args`` an ``SFTConfig`` (a
        ``TrainingArguments`` is converted as ``SFTTrainer`` does), ``sure`` the
        :class:`SureArguments`; every other keyword is ``SFTTrainer``'s (``processing_class``,
        ``data_collator``, ``eval_dataset``, ``formatting_func``, ``callbacks``, ...)."""

        _rows_of = " of the dataset SFTTrainer prepared"
        """Row indices count the prepared rows: SFTTrainer drops the rows its truncation leaves
        without a loss token, and ``shuffle_dataset`` reorders them."""
        _library_losses = (*SureTrainer._library_losses, SFTTrainer)
        """SFTTrainer's ``compute_loss`` is the library's, not an override: accepted with every
        ``replay_loss`` (a ``pair`` / ``example`` step computes its loss without it, so TRL's
        ``mean_token_accuracy``, ``entropy`` and ``num_tokens`` are not logged for those steps)."""

        def __init__(self, model=None, args=None, *, sure: SureArguments | None = None, train_dataset=None, peft_config=None, **kwargs):
            if isinstance(model, str):
                raise SureclError("SureSFTTrainer: pass a loaded model (AutoModelForCausalLM.from_pretrained(...)), not its name")
            if peft_config is not None:
                raise SureclError("SureSFTTrainer: no peft_config; the trainer puts its own fast/slow LoRA on the model (set it through SureArguments)")
            if train_dataset is not None:
                raise SureclError("SureSFTTrainer: no train_dataset; pass each task's training set to trainer.next_task(dataset)")
            if args is not None and not isinstance(args, SFTConfig):
                dict_args = args.to_dict()
                dict_args["hub_token"] = args.hub_token
                args = SFTConfig(**dict_args)
            if args is not None and getattr(args, "packing", False):
                raise SureclError("SureSFTTrainer: packing=True is not supported: it joins examples into shared rows, and the buffer scores and replays whole examples")
            if args is not None and getattr(args, "padding_free", False):
                raise SureclError("SureSFTTrainer: padding_free=True is not supported: it flattens a batch into one row, and surprise is scored per example")
            placeholder = _placeholder() if args is not None else None
            super().__init__(model, args, sure=sure, train_dataset=placeholder, **kwargs)
            self.train_dataset = None

        def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
            """``SFTTrainer``'s preparation, with ``completion_only_loss`` (when the SFTConfig
            leaves it None) decided by this dataset's own format: SFTTrainer decides it once
            from its training set, but here each task is a training set of its own and every
            evaluation set (a dict's included) is prepared for its own loss, whatever task
            trained last."""
            if args.completion_only_loss is not None or self._skip_prepare_dataset:
                return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)
            own = _is_prompt_completion(next(iter(dataset), None))
            if own and formatting_func is not None:
                raise SureclError(f"SureSFTTrainer: {dataset_name}: a formatting_func cannot be combined with completion_only_loss (SFTTrainer's rule)")
            decided, self.completion_only_loss = self.completion_only_loss, own
            try:
                return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)
            finally:
                self.completion_only_loss = decided

        def _prepared(self, dataset):
            """The task's raw SFT dataset through ``SFTTrainer``'s preparation, then the
            Trainer's column removal (``SureTrainer._prepared``, which reads ``label_column``
            from the prepared rows: SFTTrainer's ``shuffle_dataset`` reorders them, and rows
            truncation leaves without a loss token are dropped)."""
            if not isinstance(dataset, datasets.Dataset):
                raise SureclError(f"SureSFTTrainer.next_task: a datasets.Dataset (map-style), got {type(dataset).__name__}")
            if len(dataset) == 0:  # before SFTTrainer's preparation, whose column check would speak of columns instead
                raise SureclError(f"SureSFTTrainer.next_task: task {self.task} has no training examples")
            if not self._skip_prepare_dataset:
                sample = dataset[0]
                text_field = getattr(self.args, "dataset_text_field", "text")
                known = {"messages", "conversations", "prompt", "input_ids", text_field}  # conversations: TRL's from/value rows
                if self._formatting_func is None and not known & set(sample):
                    raise SureclError(
                        f"SureSFTTrainer.next_task: task {self.task}'s rows have the columns {sorted(sample)}; SFTTrainer reads "
                        f"'messages' (or 'conversations'), 'prompt' and 'completion', or '{text_field}' (SFTConfig.dataset_text_field): rename the "
                        "columns, or pass formatting_func="
                    )
                if self._formatting_func is None and "prompt" in sample and "completion" not in sample and not (known - {"prompt"}) & set(sample):
                    other = next((c for c in ("response", "output", "answer", "target") if c in sample), None)
                    raise SureclError(
                        f"SureSFTTrainer.next_task: task {self.task}'s rows have 'prompt' but no 'completion' (SFTTrainer's prompt-completion "
                        f"rows need both){f': rename {other!r} to completion' if other else ''}"
                    )
                if "image" in sample or "images" in sample:
                    raise SureclError("SureSFTTrainer: vision datasets are not supported")
                if self.args.assistant_only_loss and not is_conversational(sample):
                    raise SureclError("SureSFTTrainer: assistant_only_loss=True needs conversational rows (messages, or prompt/completion as turns)")
                if self.args.completion_only_loss is None:  # SFTTrainer's default for the task (_prepare_dataset decides it so)
                    self.completion_only_loss = _is_prompt_completion(sample)
                if self.completion_only_loss and self._formatting_func is not None:
                    raise SureclError("SureSFTTrainer: a formatting_func cannot be combined with completion_only_loss (SFTTrainer's rule)")
                dataset = self._prepare_dataset(dataset, self.processing_class, self.args, False, self._formatting_func, f"task {self.task}")
            self._reject_skip_prepare_without_labels({"train": dataset}, self.data_collator)
            return super()._prepared(dataset)

    return SureSFTTrainer


def __getattr__(name: str):
    global _CLASS
    if name == "SureSFTTrainer":
        if _CLASS is None:
            _CLASS = _build()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SureArguments", "SureSFTTrainer"]  # noqa: F822 - SureSFTTrainer comes from __getattr__ (built on first import)
