"""ContraGAN: a class-conditional GAN trained with the 2C loss, ProjGAN/ACGAN baselines,
sampling and offline metrics. The pipelines land here with their issues; ``contragan --help``
lists what exists."""
