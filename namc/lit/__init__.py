"""namc.lit."""
