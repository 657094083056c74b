"""Results: the one JSON shape (docs/results-format.md) and interactive HTML reports."""
