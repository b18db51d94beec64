"""namc.eval."""
