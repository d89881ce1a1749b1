"""Tokenizer side: chunk markup, chat and auto-chunk forms, intake checks, and the figures in responses."""
