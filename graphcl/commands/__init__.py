"""The ``graphcl`` commands, one module each: ``pretrain``, ``finetune``, ``probe``, ``augment``."""
