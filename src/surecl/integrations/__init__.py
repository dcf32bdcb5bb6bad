"""SuRe inside other training frameworks: :mod:`surecl.integrations.transformers` adds it to a
``transformers.Trainer`` script (``SureTrainer``)."""
