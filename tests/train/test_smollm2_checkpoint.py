"""SmolLM2-135M-Instruct (converted once from its GGUF file, see tests/test_models.py) is a
plain trainable model: a training checkpoint of it saves, and the saved folder loads back to the
same weights (a run on the CPU default used to fail at its first checkpoint: transformers kept
the model marked GGUF-quantized and refused to save it)."""

from __future__ import annotations

import torch

from kernel.loss import LossConfig
from kernel.models import SMOLLM2, load_causal_lm
from kernel.train.optim import OptimConfig
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer


def test_smollm2_checkpoint_saves_and_loads_back(tmp_path):
    trainer = TorchTrainer(
        SMOLLM2, OptimConfig(), LossConfig(), TorchTrainerConfig(), total_steps=1
    )
    out = trainer.save(tmp_path / "ckpt")
    saved = load_causal_lm(str(out))
    ours = dict(trainer.model.named_parameters())
    for name, p in saved.named_parameters():
        assert torch.equal(p, ours[name].detach()), name
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(saved(ids).logits, trainer.model(ids).logits)
