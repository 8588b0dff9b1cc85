"""Image representation learning: SimCLR, SupCon (+ CE baseline), CLAE, LoCo and the
feature-suppression studies. The pipelines land here with their issues; ``imagecl --help`` lists
what exists."""
