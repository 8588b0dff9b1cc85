"""The ``imagecl`` commands, one module each: train, eval, finetune, study."""
