"""Text: the implicit-change template and caption tokenizers."""
