"""template: the smallest complete multi-agent recipe, to copy when you start your own.

A proposer writes an arithmetic problem of the kind its data row asks for; a solver answers it
several times; the proposer is paid for problems the solver gets right sometimes but not always
(learnable ones), the solver for right answers. Every part a recipe has is here once:
config.py, prompts.py, generate.py, reward.py, data/, presets/ and
tests/recipes/test_template.py. README.md says how to copy it.
"""
