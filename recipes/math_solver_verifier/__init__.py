"""Recipe math_solver_verifier (see README.md in this folder)."""
