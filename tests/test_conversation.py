"""Tests for kernel.conversation.Conversation: token-exact multi-turn dialogues.

Two ChatML-style templates are checked: SmolLM2's real one and a Qwen2.5-style one (same
tokenizer, Qwen2.5's template with its default system prompt and tool turns). "Generated"
turns are ids the test makes (the text encoded, plus <|im_end|> as an engine keeps the matched
stop token), and one test samples real turns from the tiny model and feeds the ids in as they
came out. Expected ids are written from the ChatML strings by hand, not from the builder.
"""

from __future__ import annotations

import copy

import pytest

from kernel.conversation import Conversation, ConversationError
from kernel.sample import Status

IM_END = 2  # SmolLM2's <|im_end|>, also its eos
NL = 198  # "\n"

# Qwen2.5-Instruct's chat template (tools branch included), as shipped with the model.
QWEN25_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user '
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    '\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name '
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


@pytest.fixture(scope="module")
def qwen_tokenizer(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = QWEN25_TEMPLATE
    tok.name_or_path = "qwen2.5-style"
    return tok


@pytest.fixture(params=["smollm2", "qwen2.5"])
def tokenizer(request, smollm2_tokenizer, qwen_tokenizer):
    return smollm2_tokenizer if request.param == "smollm2" else qwen_tokenizer


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def engine_output(tok, text: str) -> list[int]:
    """What an engine returns for ``text``: its ids plus the matched stop token."""
    return [*enc(tok, text), IM_END]


def masked_spans(tok, ids: list[int], mask: list[int]) -> list[str]:
    """Decode each maximal run of mask == 1."""
    spans, run = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            run.append(t)
        elif run:
            spans.append(tok.decode(run))
            run = []
    if run:
        spans.append(tok.decode(run))
    return spans


# ---- the dialogue renders exactly like the template ----------------------------------------------


@pytest.mark.parametrize("system", [None, "You are a careful tutor."])
def test_multi_turn_matches_chat_template_and_masks_only_assistant_content(tokenizer, system):
    replies = ["2+2 = 4.", "The calculator agrees: 4.", "You're welcome!"]
    others = [("user", "What is 2+2?"), ("tool", "calculator: 4"), ("user", "Thanks!")]
    conv = Conversation(tokenizer, max_context_len=4096, system=system)
    messages = [] if system is None else [{"role": "system", "content": system}]
    first_prompt = None
    for (role, content), reply in zip(others, replies, strict=True):
        assert conv.add_message(role, content)
        messages.append({"role": role, "content": content})
        if first_prompt is None:
            first_prompt = conv.assistant_prompt_ids()
        out = engine_output(tokenizer, reply)
        assert conv.add_generation(out, [-1.0] * len(out))
        messages.append({"role": "assistant", "content": reply})
    sample = conv.to_sample(agent="tutor")

    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(sample.prompt_ids + sample.response_ids) == rendered
    # the prompt is exactly the template's render up to the first assistant header
    header_render = tokenizer.apply_chat_template(
        messages[: 1 + (system is not None)], tokenize=False, add_generation_prompt=True
    )
    assert sample.prompt_ids == first_prompt == enc(tokenizer, header_render)
    assert masked_spans(tokenizer, sample.response_ids, sample.loss_mask) == [
        r + "<|im_end|>" for r in replies
    ]
    assert conv.messages == messages
    assert sample.status is Status.COMPLETED and sample.agent == "tutor"


def test_qwen_default_system_prompt_and_tool_turn_ids(qwen_tokenizer):
    tok = qwen_tokenizer
    conv = Conversation(tok, max_context_len=4096)
    conv.add_message("user", "hi")
    conv.add_generation(engine_output(tok, "Hello"), [-0.25, -0.5])
    conv.add_message("tool", "42")
    sample_ids = conv.assistant_prompt_ids()
    # written out by hand from Qwen2.5's ChatML layout: tool output goes in a user turn
    expected = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        "Hello<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.decode(sample_ids) == expected


def test_sampled_ids_are_kept_even_when_not_the_canonical_tokenization(smollm2_tokenizer):
    tok = smollm2_tokenizer
    per_char = [i for c in "hello" for i in enc(tok, c)]  # h e l l o, one token each
    assert per_char != enc(tok, "hello")  # canonical is the single token 28120
    conv = Conversation(tok, max_context_len=512)
    conv.add_message("user", "say hello")
    conv.add_generation([*per_char, IM_END], [-0.1] * 6)
    conv.add_message("user", "again")
    s = conv.to_sample()
    assert [t for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m] == [*per_char, IM_END]
    assert tok.decode(s.prompt_ids + s.response_ids) == tok.apply_chat_template(
        [
            {"role": "user", "content": "say hello"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
        ],
        tokenize=False,
    )


def test_a_forced_prefix_is_context_not_loss_and_part_of_the_turns_text(smollm2_tokenizer):
    """A turn that starts with given ids (e.g. an action tag): they are sent with the prompt,
    kept in the dialogue with mask 0 and logprob 0, and the turn's message is prefix + sample."""
    tok = smollm2_tokenizer
    conv = Conversation(tok, max_context_len=512)
    conv.add_message("user", "find it")
    prefix = enc(tok, "<search>")
    sent = conv.assistant_prompt_ids(prefix)
    assert sent[-len(prefix) :] == prefix and sent[: -len(prefix)] == conv.assistant_prompt_ids()
    assert conv.max_new_tokens_for_turn(1000, len(prefix)) + len(prefix) == (
        conv.max_new_tokens_for_turn(1000)
    )
    sampled = engine_output(tok, "cats</search>")
    conv.add_generation(sampled, [-0.5] * len(sampled), prefix=prefix)
    conv.add_message("user", "done")
    s = conv.to_sample()
    n = len(prefix)  # the response starts with the prefix: the prompt is what precedes it
    assert s.prompt_ids + s.response_ids[:n] == sent
    assert s.loss_mask[:n] == [0] * n and s.rollout_logprobs[:n] == [0.0] * n
    assert [t for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m] == sampled
    assert conv.messages[-2] == {"role": "assistant", "content": "<search>cats</search>"}


# ---- mask, logprobs, weight versions -------------------------------------------------------------


def test_logprobs_and_mask_aligned_with_end_of_turn_appended_when_not_sampled(smollm2_tokenizer):
    tok = smollm2_tokenizer
    conv = Conversation(tok, max_context_len=1024, system="S")
    conv.add_message("user", "hi")
    g1 = engine_output(tok, "Yes sure")  # the engine kept the matched stop token
    lp1 = [-0.1 * (i + 1) for i in range(len(g1))]
    conv.add_generation(g1, lp1, weight_version=3)
    conv.add_message("user", "ok")  # a partner's turn: text, never trained on
    g2 = enc(tok, "Bye")  # stop trimmed (or cut by length): no <|im_end|> sampled
    lp2 = [-2.0] * len(g2)
    conv.add_generation(g2, lp2, weight_version=4)
    s = conv.to_sample(group_id=7, index=1)

    assert s.prompt_ids == enc(
        tok,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    )
    user = enc(tok, "<|im_start|>user\nok<|im_end|>\n")
    header = enc(tok, "<|im_start|>assistant\n")
    # g1 | "\n" from the template | partner turn | header | g2 | <|im_end|> "\n" from the template
    assert s.response_ids == [*g1, NL, *user, *header, *g2, IM_END, NL]
    n_gap = 1 + len(user) + len(header)
    assert s.loss_mask == [1] * len(g1) + [0] * n_gap + [1] * len(g2) + [0, 0]
    assert s.rollout_logprobs == lp1 + [0.0] * n_gap + lp2 + [0.0, 0.0]
    assert s.weight_versions == [3, 4]
    assert (s.group_id, s.index) == (7, 1)


def test_two_agents_each_train_only_on_their_own_tokens(smollm2_tokenizer, qwen_tokenizer):
    doctor = Conversation(smollm2_tokenizer, 2048, system="You are a doctor.")
    patient = Conversation(qwen_tokenizer, 2048, system="You are a patient with a cough.")
    doctor.add_message("user", "Hello doctor.")
    d_said, p_said = ["What brings you in?", "Any fever?"], ["I keep coughing.", "No fever."]
    for d, p in zip(d_said, p_said, strict=True):
        out = engine_output(smollm2_tokenizer, d)
        doctor.add_generation(out, [-1.0] * len(out))
        patient.add_message("user", d)  # the doctor's words enter the patient's dialogue as text
        out = engine_output(qwen_tokenizer, p)
        patient.add_generation(out, [-1.0] * len(out))
        doctor.add_message("user", p)
    sd, sp = doctor.to_sample(agent="doctor"), patient.to_sample(agent="patient")
    assert masked_spans(smollm2_tokenizer, sd.response_ids, sd.loss_mask) == [
        t + "<|im_end|>" for t in d_said
    ]
    assert masked_spans(qwen_tokenizer, sp.response_ids, sp.loss_mask) == [
        t + "<|im_end|>" for t in p_said
    ]
    # the patient's prompt holds the doctor's first words, masked out as prompt
    assert "What brings you in?" in qwen_tokenizer.decode(sp.prompt_ids)


def test_train_from_trains_only_the_turns_after_it(smollm2_tokenizer):
    """Per-turn credit: a sample of the second turn in its whole context trains that turn only;
    the first turn's own sample (taken before the second) trains the first."""
    tok = smollm2_tokenizer
    conv = Conversation(tok, 2048, system="You answer.")
    conv.add_message("user", "What is 2+2?")
    out = engine_output(tok, "4.")
    conv.add_generation(out, [-1.0] * len(out))
    first = conv.to_sample(agent="a", turn=0)
    conv.add_message("user", "Sure?")
    start = len(conv.ids)
    out = engine_output(tok, "Yes, 4.")
    conv.add_generation(out, [-0.5] * len(out))
    second = conv.to_sample(train_from=start, agent="a", turn=1)
    assert masked_spans(tok, first.response_ids, first.loss_mask) == ["4.<|im_end|>"]
    assert masked_spans(tok, second.response_ids, second.loss_mask) == ["Yes, 4.<|im_end|>"]
    assert second.prompt_ids == first.prompt_ids and "4." in tok.decode(second.response_ids)
    whole = conv.to_sample(agent="a")
    assert whole.loss_mask == conv.to_sample(train_from=0, agent="a").loss_mask
    assert masked_spans(tok, whole.response_ids, whole.loss_mask) == [
        "4.<|im_end|>",
        "Yes, 4.<|im_end|>",
    ]
    assert not any(conv.to_sample(train_from=10**6, agent="a").loss_mask)


# ---- context budget ------------------------------------------------------------------------------


def budget_conv(tok, extra: int) -> tuple[Conversation, int]:
    prompt = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    p = len(enc(tok, prompt))
    conv = Conversation(tok, max_context_len=p + extra, system="S")
    conv.add_message("user", "hi")
    assert len(conv.assistant_prompt_ids()) == p
    return conv, p


def test_budget_refuses_a_turn_that_does_not_fit_and_reports_truncated(smollm2_tokenizer):
    tok = smollm2_tokenizer
    conv, p = budget_conv(tok, extra=6)
    # 6 left after the header; 1 kept back for the "\n" after a sampled <|im_end|>: 6 - 1 = 5
    assert conv.max_new_tokens_for_turn(100) == 5
    assert conv.max_new_tokens_for_turn(3) == 3
    g = engine_output(tok, "Yes")  # 2 ids
    assert conv.add_generation(g, [-0.3, -0.4])
    assert conv.remaining() == 6 - 2 - 1  # the ids and the template's "\n"
    assert not conv.truncated
    assert conv.add_message("user", "tell me more about it") is False  # 8+ ids > 3 left
    assert conv.truncated
    assert conv.add_generation([10539], [-1.0]) is False
    assert conv.max_new_tokens_for_turn(10) == 0
    s = conv.to_sample()
    assert s.status is Status.TRUNCATED
    assert s.response_ids == [*g, NL] and len(s.prompt_ids) == p


def test_exact_fit_is_not_truncated_until_another_turn_is_asked_for(smollm2_tokenizer):
    tok = smollm2_tokenizer
    conv, _ = budget_conv(tok, extra=6)
    g = [10539] * 4 + [IM_END]  # the 5 allowed ids, stop token last
    assert conv.add_generation(g, [-1.0] * 5)
    assert conv.remaining() == 0 and not conv.truncated
    assert conv.to_sample().status is Status.COMPLETED
    assert conv.max_new_tokens_for_turn(10) == 0  # nothing fits: the dialogue is cut here
    assert conv.truncated and conv.to_sample().status is Status.TRUNCATED


def test_overlong_generation_is_cut_at_the_budget(smollm2_tokenizer):
    tok = smollm2_tokenizer
    conv, _ = budget_conv(tok, extra=4)
    g = [10539] * 6
    assert conv.add_generation(g, [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    s = conv.to_sample()
    assert s.status is Status.TRUNCATED
    assert s.response_ids == [10539] * 4  # 4 ids fit; no end-of-turn ids after them
    assert s.rollout_logprobs == [-0.1, -0.2, -0.3, -0.4] and s.loss_mask == [1] * 4
    assert len(s.prompt_ids) + len(s.response_ids) == conv.max_context_len


# ---- templates that do not extend as a prefix, and bad input -------------------------------------


def test_qwen_template_merging_consecutive_tool_turns_is_a_clear_error(qwen_tokenizer):
    conv = Conversation(qwen_tokenizer, 1024)
    conv.add_message("user", "look it up")
    conv.add_generation(engine_output(qwen_tokenizer, "ok"), [-1.0, -1.0])
    conv.add_message("tool", "result one")
    before = conv.ids
    # Qwen2.5 merges consecutive tool turns: the first one's <|im_end|> disappears
    with pytest.raises(ConversationError, match=r"'qwen2.5-style' does not extend .* token prefix"):
        conv.add_message("tool", "result two")
    assert conv.ids == before  # the failed turn left nothing behind


def test_template_stripping_earlier_reasoning_is_a_clear_error(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.name_or_path = "think-stripper"
    # like Qwen3: earlier assistant turns lose their <think> part once the dialogue moves on
    tok.chat_template = (
        "{% for m in messages %}{% set c = m.content %}"
        "{% if m.role == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}"
        "{% endif %}{{ '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    conv = Conversation(tok, 1024)
    conv.add_message("user", "2+2?")
    out = engine_output(tok, "<think>easy</think>4")
    conv.add_generation(out, [-1.0] * len(out))
    with pytest.raises(ConversationError, match="'think-stripper' does not extend"):
        conv.add_message("user", "and 3+3?")


def test_bad_input_is_named(smollm2_tokenizer):
    conv = Conversation(smollm2_tokenizer, 64)
    conv.add_message("user", "hi")
    with pytest.raises(ConversationError, match=r"len\(logprobs\)=1 != len\(ids\)=2"):
        conv.add_generation([5, 6], [-1.0])
    with pytest.raises(ConversationError, match="ids must be ints"):
        conv.add_generation([5.0], [-1.0])
    with pytest.raises(ConversationError, match="content of the 'user' turn must be str"):
        conv.add_message("user", None)
    with pytest.raises(ConversationError, match="needs at least one add_generation"):
        conv.to_sample()
    with pytest.raises(ValueError, match="max_context_len"):
        Conversation(smollm2_tokenizer, 0)
    conv.add_generation([5], [-1.0])
    with pytest.raises(ConversationError, match=r"fills .*'loss_mask'"):
        conv.to_sample(loss_mask=[1])


# ---- a real model's turns go in unchanged --------------------------------------------------------


def test_real_tiny_model_turns_are_kept_and_logprobs_match_a_recompute(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    torch.manual_seed(0)
    conv = Conversation(tok, max_context_len=256, system="You are a doctor.")
    conv.add_message("user", "I have a cough.")
    sampled = []
    for version, partner in enumerate(["And a fever.", None]):
        prompt = conv.assistant_prompt_ids()
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=conv.max_new_tokens_for_turn(6),
                do_sample=True,  # from the model's own distribution: temperature 1, no top-k/p
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                output_logits=True,
                return_dict_in_generate=True,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        new = out.sequences[0, len(prompt) :]  # (T,)
        logits = torch.stack(out.logits, dim=1)[0]  # (T, V) raw logits of each step
        lps = torch.log_softmax(logits.float(), -1).gather(-1, new[:, None])[:, 0]  # (T,)
        sampled.append(new.tolist())
        conv.add_generation(new.tolist(), lps.tolist(), weight_version=version)
        if partner:
            conv.add_message("user", partner)
    s = conv.to_sample(agent="doctor")

    assert [t for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m] == [
        t for turn in sampled for t in turn
    ]
    assert s.weight_versions == [0, 1]
    # a trainer's forward over the whole sample gives the rollout logprobs back at the mask
    full = torch.tensor([s.prompt_ids + s.response_ids])  # (1, P + R)
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0].float(), -1)  # (P + R, V)
    p = len(s.prompt_ids)
    for j, (m, lp) in enumerate(zip(s.loss_mask, s.rollout_logprobs, strict=True)):
        if m:
            assert logp[p + j - 1, s.response_ids[j]].item() == pytest.approx(lp, abs=1e-4)
        else:
            assert lp == 0.0
    assert tok.decode(full[0].tolist()) == tok.apply_chat_template(conv.messages, tokenize=False)
