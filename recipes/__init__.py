"""Tandem recipes: each sub-folder is a complete project you can copy (house rule 1)."""
