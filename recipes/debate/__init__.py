"""Recipe debate (see README.md in this folder)."""
