"""Recipe deep_research (see README.md in this folder)."""
