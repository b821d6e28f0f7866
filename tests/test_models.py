"""SmolLM2's converted copy: made once from the GGUF file, then every load reads it. The copy
must be the same model and tokenizer as the GGUF (bit-identical weights, same ids for the same
chat), and a cache that cannot be written must fall back to the GGUF with a warning."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from kernel import models
from kernel.models import SMOLLM2, SMOLLM2_GGUF, load_causal_lm, load_tokenizer, smollm2_dir

CHAT = [
    {"role": "system", "content": "You are a careful doctor."},
    {"role": "user", "content": "My chest hurts when I climb stairs — 3 weeks now. Ça va?"},
]


def _ids(tok) -> list[int]:
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.slow
def test_the_copy_is_made_once_and_is_the_gguf_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    model = load_causal_lm(SMOLLM2)
    [copy] = tmp_path.glob("smollm2-*")
    assert models.smollm2_copy() == copy
    first = (copy / "model.safetensors").stat().st_mtime_ns
    load_causal_lm(SMOLLM2)
    assert (copy / "model.safetensors").stat().st_mtime_ns == first  # read, not made again
    assert [p.name for p in tmp_path.iterdir()] == [copy.name]  # no temporary folder left

    ref = models._load_causal_lm(str(smollm2_dir()), "float32", {"gguf_file": SMOLLM2_GGUF})
    ours = model.state_dict()
    assert ours.keys() == ref.state_dict().keys()
    for name, p in ref.state_dict().items():
        assert torch.equal(ours[name], p), name
    assert model.config.tie_word_embeddings == ref.config.tie_word_embeddings

    tok = load_tokenizer(SMOLLM2)
    gguf_tok = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    assert tok.get_vocab() == gguf_tok.get_vocab()
    assert _ids(tok) == _ids(gguf_tok)
    assert tok.chat_template == gguf_tok.chat_template
    assert (tok.eos_token_id, tok.bos_token_id) == (gguf_tok.eos_token_id, gguf_tok.bos_token_id)


def test_an_unwritable_cache_falls_back_to_the_gguf(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TANDEM_CACHE", str(blocker / "tandem"))
    with pytest.warns(UserWarning, match="cannot write its converted copy"):
        tok = load_tokenizer(SMOLLM2)
    assert _ids(tok)[:1] == tok.encode("<|im_start|>", add_special_tokens=False)
    assert blocker.read_text() == "not a folder"
