"""The package version, in one place (setup.cfg reads it; saved models record it)."""

__version__ = "0.1.0"
