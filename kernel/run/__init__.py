"""The runtime layer: who plays what (``agents``), the typed run config and its resolved plan
(``config``), held-out evaluation and a finished run read back from its files (``results``),
checkpoints, the started run (``runtime``), the training loop (``loop``) and the other jobs a
run's models do: ``collect``, ``sft``, ``dpo``. Imports nothing: each module is imported by its
own path."""
