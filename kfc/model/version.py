"""kfc's version, recorded in compile reports, caches and packages."""

__version__ = "0.1.0"
