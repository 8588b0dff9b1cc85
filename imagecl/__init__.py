"""Image representation learning: SimCLR, SupCon (+ CE baseline), CLAE, LoCo and the
papers' findings as studies: ``imagecl train|eval|finetune|study`` (``imagecl --help``)."""
