"""Recipe code_pair (see README.md in this folder)."""
