"""Recipe takes_two (see README.md in this folder)."""
