"""GraphCL: batched graph augmentations and GNN pre-training on molecular graphs, fine-tuning
and probing: ``graphcl pretrain|finetune|probe|augment`` (``graphcl --help``)."""
