"""Token-in, token-out multi-turn dialogue for one training agent (house rule 9).

An agent's episode is a dialogue: its own sampled turns, and turns by partner agents, tools
and users. Training needs the exact ids the engine sampled, a loss mask that is 1 only on
them, and the logprobs the engine reported, all aligned. Re-rendering the dialogue as text
and tokenizing it again would give different ids (BPE merges differ across turn boundaries,
sampled non-canonical tokenizations are lost), so ``Conversation`` keeps one growing list
of ids instead:

- Template tokens come from the agent's own tokenizer's chat template, never hard-coded:
  the ids a new turn adds are the token difference between two renders of the message list
  (before and after the turn; with ``add_generation_prompt`` for the assistant header). Each
  new render must extend the previous one as a token prefix; templates that rewrite earlier
  turns (think-stripping, merged tool turns) fail with an error naming the template.
- Sampled ids are appended exactly as given. The template's end-of-turn ids (ChatML:
  ``<|im_end|>`` and a newline) follow; whatever the engine already sampled of them (it
  keeps the matched stop token) stays sampled, the rest is appended with mask 0.
- A context budget (``max_context_len``) bounds the whole dialogue; once a turn no longer
  fits, the conversation is truncated: the turn is refused, and ``to_sample`` reports
  ``Status.TRUNCATED``.

Each agent keeps its own Conversation with its own tokenizer; a partner's turn enters as
text through ``add_message``, which is right since it is not this agent's sample.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Sequence
from typing import Any

from kernel.sample import Sample, Status

# Stands in for assistant content when asking the template what it puts around a reply;
# printable, so no template special-cases it, and unlikely to occur in a template.
_SENTINEL = "\u27e6TANDEM-REPLY\u27e7"

# Sample fields the conversation fills itself; to_sample refuses them from the caller.
_OWN_FIELDS = ("prompt_ids", "response_ids", "loss_mask", "rollout_logprobs", "weight_versions")


class ConversationError(ValueError):
    """The dialogue cannot be built token-exactly (template or input problem); says why."""


class Conversation:
    """One agent's dialogue as exact token ids, loss mask and rollout logprobs.

    ``tokenizer`` is the agent's own HF tokenizer (with a chat template); ``system`` is an
    optional first system message; ``template_kwargs`` go to every ``apply_chat_template``
    call (e.g. ``{"enable_thinking": False}``).
    """

    def __init__(
        self,
        tokenizer: Any,
        max_context_len: int,
        system: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(max_context_len, int) or max_context_len <= 0:
            raise ValueError(f"max_context_len must be a positive int, got {max_context_len!r}")
        if not getattr(tokenizer, "chat_template", None):
            raise ConversationError(f"tokenizer {_name(tokenizer)!r} has no chat_template")
        self.tokenizer = tokenizer
        self.max_context_len = max_context_len
        self.template_kwargs = dict(template_kwargs or {})
        self.truncated = False
        self._messages: list[dict[str, str]] = []
        self._rendered_ids: list[int] | None = []  # the template's ids for _messages (no gen
        # prompt); None until needed after a generation (a one-turn episode never needs it)
        self._ids: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self._prompt_len: int | None = None  # set by the first generation
        self._weight_versions: list[int] = []
        self._turn_cache: tuple[int, list[int], list[int]] | None = None
        if system is not None:
            self.add_message("system", system)

    # ---- reading -----------------------------------------------------------------------------

    @property
    def messages(self) -> list[dict[str, str]]:
        """The dialogue as chat messages (assistant content decoded from its sampled ids)."""
        return [dict(m) for m in self._messages]

    @property
    def ids(self) -> list[int]:
        """Every token id so far, prompt and response."""
        return list(self._ids)

    def remaining(self) -> int:
        """Tokens left under ``max_context_len``."""
        return max(self.max_context_len - len(self._ids), 0)

    def assistant_prompt_ids(self, prefix: Sequence[int] = ()) -> list[int]:
        """The ids to send to the engine for the agent's next turn: everything so far plus
        the template's assistant header, and ``prefix``: ids the turn starts with that the agent
        does not sample (a forced opening, e.g. an action tag)."""
        header, _ = self._assistant_turn()
        return self._ids + header + list(prefix)

    def max_new_tokens_for_turn(self, max_response_len: int, prefix_len: int = 0) -> int:
        """``min(max_response_len, budget left after the assistant header and a prefix of
        prefix_len ids)``, keeping room for the template's end-of-turn ids after the sampled
        stop token. Returns 0 (and marks the conversation truncated) when no token fits."""
        if max_response_len <= 0:
            raise ValueError(f"max_response_len must be > 0, got {max_response_len}")
        if self.truncated:
            return 0
        header, end = self._assistant_turn()
        # the stop token the engine samples is the first end-of-turn id; the rest is appended
        left = self.max_context_len - len(self._ids) - len(header) - prefix_len
        left -= max(len(end) - 1, 0)
        n = min(max_response_len, max(left, 0))
        if n == 0:
            self.truncated = True
        return n

    def fork(self) -> Conversation:
        """An independent copy of the dialogue so far (ids, mask, logprobs, messages): several
        continuations of one prompt (``n`` of them) each grow their own."""
        other = copy.copy(self)
        other._messages = [dict(m) for m in self._messages]
        other._ids, other._mask = list(self._ids), list(self._mask)
        other._logprobs, other._weight_versions = list(self._logprobs), list(self._weight_versions)
        if self._rendered_ids is not None:
            other._rendered_ids = list(self._rendered_ids)
        other.template_kwargs = dict(self.template_kwargs)
        return other

    # ---- adding turns --------------------------------------------------------------------------

    def add_message(self, role: str, content: str) -> bool:
        """Add a turn the agent did not sample (system, user, partner, tool; mask 0).

        Returns False, and marks the conversation truncated, when it does not fit the budget
        (or the conversation is already truncated); nothing is added then.
        """
        if not isinstance(role, str) or not role:
            raise ConversationError(f"role must be a non-empty str, got {role!r}")
        if not isinstance(content, str):
            raise ConversationError(f"content of the {role!r} turn must be str, got {content!r}")
        if self.truncated:
            return False
        message = {"role": role, "content": content}
        rendered = self._tokens(self._render([*self._messages, message]))
        new = self._extension(self._rendered(), rendered, f"adding a {role!r} turn")
        if len(self._ids) + len(new) > self.max_context_len:
            self.truncated = True
            return False
        self._append(new, mask=0)
        self._messages.append(message)
        self._rendered_ids = rendered
        self._turn_cache = None
        return True

    def add_generation(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float],
        weight_version: int | None = None,
        prefix: Sequence[int] = (),
    ) -> bool:
        """Add the agent's sampled turn: its ids exactly as the engine returned them (mask 1)
        and their logprobs, after the assistant header and the turn's ``prefix`` (the forced
        opening sent with ``assistant_prompt_ids``; mask 0) and before the template's
        end-of-turn ids (mask 0 where not sampled).

        Sampled ids past the budget are cut off (the engine was asked for too many), and the
        end-of-turn ids are left out when they do not fit; either marks the conversation
        truncated. Returns False, adding nothing, when already truncated or the header does
        not fit. A sampled stop token that is not the template's end of turn (e.g. a base
        model's ``<|endoftext|>``) stays part of the content, as it was sampled.
        """
        try:
            ids = [operator.index(t) for t in ids]  # ints (numpy/torch ints too), never floats
        except TypeError as e:
            raise ConversationError(f"generation ids must be ints: {e}") from e
        if any(t < 0 for t in ids):
            raise ConversationError("generation ids must be non-negative")
        logprobs = [float(x) for x in logprobs]
        if len(logprobs) != len(ids):
            raise ConversationError(
                f"len(logprobs)={len(logprobs)} != len(ids)={len(ids)} for the generation"
            )
        if self.truncated:
            return False
        header, end = self._assistant_turn()
        prefix = list(prefix)
        if len(self._ids) + len(header) + len(prefix) > self.max_context_len:
            self.truncated = True
            return False
        self._append(header, mask=0)
        if self._prompt_len is None:
            self._prompt_len = len(self._ids)
        if weight_version is not None:
            self._weight_versions.append(int(weight_version))
        self._append(prefix, mask=0)

        fit = self.max_context_len - len(self._ids)
        if len(ids) > fit:
            ids, logprobs = ids[:fit], logprobs[:fit]
            self.truncated = True
        sampled_end = _overlap(ids, end)  # how much of the end-of-turn ids was sampled
        self._ids += ids
        self._mask += [1] * len(ids)
        self._logprobs += logprobs
        missing = end[sampled_end:]
        if len(self._ids) + len(missing) > self.max_context_len:
            self.truncated = True
            missing = []
        self._append(missing, mask=0)

        content_ids = ids[: len(ids) - sampled_end]
        content = self.tokenizer.decode(prefix + content_ids, skip_special_tokens=False)
        self._messages.append({"role": "assistant", "content": content})
        self._rendered_ids = None
        self._turn_cache = None
        return True

    def add_reply(self, content: str) -> bool:
        """Add an assistant turn given as text (supervised data): its tokens and the template's
        end-of-turn token get mask 1, as a sampled turn that stopped would (logprobs 0).
        Returns False, as ``add_generation``, when it does not fit."""
        if not isinstance(content, str):
            raise ConversationError(f"reply content must be str, got {content!r}")
        _, end = self._assistant_turn()
        ids = self._tokens(content) + end[:1]
        return self.add_generation(ids, [0.0] * len(ids)) and not self.truncated

    # ---- output --------------------------------------------------------------------------------

    def to_sample(self, train_from: int = 0, **fields: Any) -> Sample:
        """The dialogue as one Sample: prompt_ids = the ids sent for the first generation,
        response_ids = everything after, loss mask and rollout logprobs aligned with it.

        ``train_from``: a position in ``ids`` before which nothing is trained (loss mask 0):
        a sample of the latest turn in its whole context, for per-turn credit, the earlier
        turns trained in samples of their own. ``fields`` fill the rest (agent, group_id,
        index, turn, prompt, label, metadata, status). A truncated conversation turns status
        COMPLETED (the default) into TRUNCATED.
        """
        clash = [f for f in _OWN_FIELDS if f in fields]
        if clash:
            raise ConversationError(f"to_sample fills {clash} itself; do not pass them")
        if self._prompt_len is None:
            raise ConversationError("to_sample needs at least one add_generation")
        status = fields.pop("status", Status.COMPLETED)
        if self.truncated and status == Status.COMPLETED:
            status = Status.TRUNCATED
        p = self._prompt_len
        cut = min(max(train_from - p, 0), len(self._ids) - p)  # response positions not trained
        return Sample(
            prompt_ids=self._ids[:p],
            response_ids=self._ids[p:],
            loss_mask=[0] * cut + self._mask[p + cut :],
            rollout_logprobs=self._logprobs[p:],
            weight_versions=list(self._weight_versions),
            status=status,
            **fields,
        ).validate()

    # ---- template plumbing ---------------------------------------------------------------------

    def _append(self, ids: list[int], mask: int) -> None:
        self._ids += ids
        self._mask += [mask] * len(ids)
        self._logprobs += [0.0] * len(ids)

    def _rendered(self) -> list[int]:
        """The template's ids for the messages so far (rendered again after a generation)."""
        if self._rendered_ids is None:
            self._rendered_ids = self._tokens(self._render(self._messages))
        return self._rendered_ids

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
        if not messages and not generation_prompt:
            return ""  # some templates index messages[0]; nothing rendered is nothing
        key = tuple((m["role"], m["content"]) for m in messages)
        kwargs = tuple(sorted(self.template_kwargs.items()))
        render = _render
        try:
            hash(kwargs)
        except TypeError:  # unhashable template arguments (lists, dicts): render uncached
            render = _render.__wrapped__
        try:
            return render(self.tokenizer, key, generation_prompt, kwargs)
        except Exception as e:  # jinja errors come in many types; name the template
            raise ConversationError(
                f"chat template of {_name(self.tokenizer)!r} failed to render "
                f"{[m['role'] for m in messages]}: {e}"
            ) from e

    def _tokens(self, text: str) -> list[int]:
        return list(_tokens(self.tokenizer, text))

    def _extension(self, before: list[int], after: list[int], what: str) -> list[int]:
        """The ids ``after`` adds to ``before``; an error if it is not a token prefix."""
        if after[: len(before)] != before:
            at = next(
                (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
                min(len(before), len(after)),
            )
            raise ConversationError(
                f"chat template of {_name(self.tokenizer)!r} does not extend the dialogue as a "
                f"token prefix when {what}: it rewrites earlier tokens from position {at} "
                f"(before: {self.tokenizer.decode(before[at : at + 12])!r}, after: "
                f"{self.tokenizer.decode(after[at : at + 12])!r}). Token-exact multi-turn "
                "training needs a template that only appends (e.g. one that does not strip "
                "earlier reasoning or merge consecutive turns)"
            )
        return after[len(before) :]

    def _assistant_turn(self) -> tuple[list[int], list[int]]:
        """(header ids before an assistant reply, end-of-turn ids after it), from the
        template, for the current messages; cached until the messages change."""
        n = len(self._messages)
        if self._turn_cache is not None and self._turn_cache[0] == n:
            return self._turn_cache[1], self._turn_cache[2]
        prompt_text = self._render(self._messages, generation_prompt=True)
        header = self._extension(
            self._rendered(), self._tokens(prompt_text), "adding the assistant header"
        )
        reply_text = self._render([*self._messages, {"role": "assistant", "content": _SENTINEL}])
        if not reply_text.startswith(prompt_text + _SENTINEL):
            raise ConversationError(
                f"chat template of {_name(self.tokenizer)!r} does not render an assistant reply "
                "as generation prompt + content + end of turn, so sampled ids cannot be kept "
                f"as they are (rendered tail: {reply_text[len(prompt_text) - 40 :]!r})"
            )
        end = self._tokens(reply_text[len(prompt_text) + len(_SENTINEL) :])
        self._turn_cache = (n, header, end)
        return header, end


# The episodes of a prompt group render and tokenize the same messages until they sample: both
# are memoised (per tokenizer object; keys hold the whole text, so a hit is always exact).
@functools.lru_cache(maxsize=8192)
def _render(tokenizer: Any, messages: tuple, generation_prompt: bool, kwargs: tuple) -> str:
    return tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages],
        tokenize=False,
        add_generation_prompt=generation_prompt,
        **dict(kwargs),
    )


@functools.lru_cache(maxsize=8192)
def _tokens(tokenizer: Any, text: str) -> tuple[int, ...]:
    # what apply_chat_template(tokenize=True) does: the template carries its own BOS
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def _overlap(ids: list[int], end: list[int]) -> int:
    """The longest k such that ids ends with end[:k]: how much of the end-of-turn ids the
    engine already sampled (it keeps the matched stop token)."""
    for k in range(min(len(ids), len(end)), 0, -1):
        if ids[-k:] == end[:k]:
            return k
    return 0


def _name(tokenizer: Any) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
