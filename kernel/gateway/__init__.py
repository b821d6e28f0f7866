"""Bring your own agents: an OpenAI-compatible gateway in front of a run's agents.

A program written for OpenAI's chat-completions API (``model`` = an agent's name) is trained
unmodified: ``python -m kernel train --agent_program pkg.module.function``. The gateway
(``app``) records each agent's calls as token-exact dialogues (``episodes``) and the run's hooks
(``hooks``) turn every episode of the program into samples. docs/gateway.md has the whole
contract.
"""
