"""musketeers — frozen LM experts help a small policy reason through their hidden states."""

__version__ = "0.1.0"
