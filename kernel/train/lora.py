"""LoRA: one low-rank adapter per agent over one frozen base model, trained with peft.

``LoraConfig`` is the setting (the run's ``lora`` section, overridable per agent); rank 0 means
full fine-tuning, the default. A model whose owner agent has rank > 0 trains no base weight:
each of its trainable agents gets an adapter of its own, named after the agent, with its own
AdamW and schedule (Miles' multi-LoRA: one optimizer per adapter). Its frozen agents are served
by the bare base.

``Adapters`` holds them in a torch trainer: the base loaded once and wrapped in a
``peft.PeftModel`` holding every adapter. ``use(name)`` makes one adapter the active and only
trainable one, so training agent A's adapter never changes agent B's outputs: B's gradients are
never computed and its optimizer never steps. The engines serve the same adapters under the
same names (SGLang's ``lora_path``); a weight sync sends only the adapters that stepped since
the last push (``kernel.sync.push``), as the files and tensors of PEFT's own format
(``adapter_config.json``, ``adapter_model.safetensors``), which SGLang and peft load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kernel.train.optim import OptimConfig, build_optimizer
from kernel.train.settings import LoraConfig


class Adapters:
    """A trainer's LoRA adapters: ``configs`` names them (agent -> its setting); ``model`` is
    the base, wrapped here in a PeftModel (``self.model``) holding one adapter per name, each
    with its own optimizer, schedule and step count."""

    def __init__(self, model, configs: dict[str, LoraConfig], optim: OptimConfig, total_steps: int):
        from peft import PeftModel, get_peft_model

        first, *rest = configs
        unknown = _missing_targets(model, {t for c in configs.values() for t in c.target_modules})
        if unknown:
            raise ValueError(
                f"lora.target_modules: the model has no Linear layer named {sorted(unknown)} "
                f"(its Linear layers: {sorted(_linear_names(model))})"
            )
        start = configs[first].path
        self.model = (  # a new adapter (B = 0: the base's outputs), or one from its folder
            PeftModel.from_pretrained(model, start, adapter_name=first, is_trainable=True)
            if start
            else get_peft_model(model, configs[first].peft_config(), adapter_name=first)
        )
        for name in rest:
            if configs[name].path:
                self.model.load_adapter(configs[name].path, adapter_name=name, is_trainable=True)
            else:
                self.model.add_adapter(name, configs[name].peft_config())
        self.configs = configs
        self.params = {name: _params_of(self.model, name) for name in configs}
        self.optimizers = {
            name: build_optimizer(self.params[name], optim, total_steps) for name in configs
        }
        self.steps = dict.fromkeys(configs, 0)
        self.stepped: set[str] = set()  # adapters changed since the last sync took them
        self.use(first)

    @property
    def names(self) -> list[str]:
        return list(self.configs)

    def use(self, name: str) -> None:
        """Make ``name`` the active adapter: the only one in the forward and the only one with
        gradients."""
        self.model.set_adapter(name)
        self.active = name

    def state_dict(self, name: str) -> dict[str, Tensor]:
        """Adapter ``name``'s tensors, named as in its ``adapter_model.safetensors``."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.model, adapter_name=name)

    def config_dict(self, name: str) -> dict[str, Any]:
        """Adapter ``name``'s ``adapter_config.json``, as JSON-able values."""
        config = self.model.peft_config[name]
        return json.loads(json.dumps(config.to_dict(), default=_jsonable))

    def save(self, out_dir: Path, names: Iterable[str] | None = None) -> dict[str, Path]:
        """Each adapter of ``names`` (None: all) as a PEFT folder ``out_dir/<name>``
        (adapter_config.json, adapter_model.safetensors); returns them by name."""
        from safetensors.torch import save_file

        folders = {}
        for name in self.configs if names is None else names:
            folder = folders[name] = Path(out_dir) / name
            folder.mkdir(parents=True, exist_ok=True)
            tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict(name).items()}
            save_file(tensors, folder / "adapter_model.safetensors")
            self.model.peft_config[name].save_pretrained(folder)
        return folders

    def load(self, ckpt: Path) -> None:
        """Every adapter's weights from ``save``'s folders under ``ckpt``; raises ValueError
        naming the file whose tensors do not fit."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        for name in self.configs:
            file = Path(ckpt) / name / "adapter_model.safetensors"
            if not file.exists():
                raise FileNotFoundError(f"{file}: missing (adapter {name!r} of this trainer)")
            weights = load_file(file)
            expected = self.state_dict(name)
            wrong = sorted(set(weights) ^ set(expected))
            wrong += [k for k in weights if k in expected and weights[k].shape != expected[k].shape]
            if wrong:
                raise ValueError(
                    f"{file}: does not fit adapter {name!r} (rank {self.configs[name].rank}, "
                    f"targets {self.configs[name].target_modules}): {len(wrong)} tensors differ "
                    f"in name or shape, e.g. {wrong[:3]}"
                )
            set_peft_model_state_dict(self.model, weights, adapter_name=name)

    def optimizer_state(self) -> dict[str, Any]:
        return {
            name: {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
            for name, (opt, sched) in self.optimizers.items()
        }

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        for name, (opt, sched) in self.optimizers.items():
            opt.load_state_dict(state[name]["optimizer"])
            sched.load_state_dict(state[name]["scheduler"])


def _jsonable(value: Any) -> Any:
    """peft config values JSON cannot hold as they are (sets of module names, enums)."""
    if isinstance(value, set | frozenset):
        return sorted(value)
    return str(getattr(value, "value", value))


def _params_of(model, name: str) -> list[torch.nn.Parameter]:
    """The parameters of adapter ``name`` in every LoRA layer of ``model``."""
    from peft.tuners.lora import LoraLayer

    params = []
    for module in model.modules():
        if isinstance(module, LoraLayer):
            for attr in module.adapter_layer_names:  # lora_A, lora_B (and embedding ones)
                part = getattr(module, attr)
                if name in part:
                    held = part[name]
                    params += [held] if isinstance(held, torch.nn.Parameter) else held.parameters()
    return params


def _linear_names(model) -> set[str]:
    linears = (n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    return {n.rsplit(".", 1)[-1] for n in linears}


def _missing_targets(model, targets: set[str]) -> set[str]:
    return targets - _linear_names(model)
