"""The one exception type for bad input: its message is a single line that names the fix."""


class UserError(Exception):
    """Bad input or a missing resource. The CLI prints ``error: <message>`` and exits 2."""
