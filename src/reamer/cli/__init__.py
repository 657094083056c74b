"""The ``reamer`` command."""
