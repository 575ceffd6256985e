"""jaxcap's version (its own module: the score signatures read it without importing the package)."""

__version__ = "0.1.0"
