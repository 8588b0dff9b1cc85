"""GraphCL: batched graph augmentations and GNN pre-training on molecular graphs, fine-tuning
and probing. The pipelines land here with their issues; ``graphcl --help`` lists what exists."""
