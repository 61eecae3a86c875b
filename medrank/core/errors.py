"""The one user-facing error type."""


class MedrankError(Exception):
    """Bad input or configuration: shown to the user as one line, exit code 2."""
