"""The planted-expert checks: a synthetic store whose expert is known to help, and its runs."""
