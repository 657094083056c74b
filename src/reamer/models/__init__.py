"""Performance models shared by every policy and backend (one module per model)."""
