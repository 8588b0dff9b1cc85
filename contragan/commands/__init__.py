"""The ``contragan`` commands, one module each: ``train``, ``sample``, ``evaluate``."""
