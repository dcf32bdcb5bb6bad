"""SuRe inside other training frameworks: :mod:`surecl.integrations.transformers` adds it to a
``transformers.Trainer`` script (``SureTrainer``), :mod:`surecl.integrations.trl` to a TRL
``SFTTrainer`` script (``SureSFTTrainer``, ``pip install "surecl[trl]"``)."""
