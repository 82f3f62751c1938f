"""kfc, the kernel factory compiler."""

__version__ = "0.1.0"
