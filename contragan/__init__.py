"""ContraGAN: a class-conditional GAN trained with the 2C loss, ProjGAN/ACGAN baselines,
sampling and offline metrics: ``contragan train|sample|evaluate`` (``contragan --help``)."""
