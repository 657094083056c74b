"""Results: the one JSON shape (DESIGN.md §4) and interactive HTML reports."""
