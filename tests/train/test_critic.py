"""PPO's critic (kernel/train/critic.py): GAE and the clipped value loss against hand-computed
goldens, GAE over an agent's own tokens only, and the critic inside the torch trainer (values
learn the returns, num_critic_only_steps holds the policy, checkpoints resume it, Megatron
refuses it). Tiny real model, CPU."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from kernel.advantages import AdvantageConfig
from kernel.cli import train_config
from kernel.loss import LossConfig
from kernel.train.critic import (
    CriticConfig,
    explained_variance,
    gae,
    gae_tokens,
    value_loss,
    whiten,
)
from kernel.train.optim import OptimConfig
from kernel.train.settings import MegatronTrainerConfig, TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer
from kernel.train.trainer import build_trainer

# gamma 0.9, lambda 0.8, rewards (0, 0, 1), values (0.5, 0.2, 0.4), the value after the end 0:
# delta_2 = 1 - 0.4 = 0.6                       A_2 = 0.6
# delta_1 = 0.9 * 0.4 - 0.2 = 0.16              A_1 = 0.16 + 0.72 * 0.6 = 0.592
# delta_0 = 0.9 * 0.2 - 0.5 = -0.32             A_0 = -0.32 + 0.72 * 0.592 = 0.10624
GAE_ADV = [0.10624, 0.592, 0.6]
GAE_RET = [0.60624, 0.792, 1.0]


def test_gae_golden():
    adv, ret = gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.2, 0.4]), gamma=0.9, lam=0.8)
    assert adv.tolist() == pytest.approx(GAE_ADV)
    assert ret.tolist() == pytest.approx(GAE_RET)
    # lambda 1, gamma 1: the return is the reward itself, the advantage reward - value
    adv, ret = gae(torch.tensor([0.0, 2.0]), torch.tensor([0.5, 1.5]), gamma=1.0, lam=1.0)
    assert adv.tolist() == pytest.approx([1.5, 0.5]) and ret.tolist() == pytest.approx([2.0, 2.0])


def test_gae_runs_over_the_agents_own_tokens_only():
    """A two-turn dialogue: own tokens 0-1, the partner's reply (2-3, masked), own token 4.
    The partner's tokens are not steps: token 1's next state is token 4, and their values
    (9.0 here) never enter."""
    mask = [1, 1, 0, 0, 1]
    adv, ret = gae_tokens(mask, [0.5, 0.2, 9.0, 9.0, 0.4], reward=1.0, gamma=0.9, lam=0.8)
    assert [adv[i] for i in (0, 1, 4)] == pytest.approx(GAE_ADV)
    assert [ret[i] for i in (0, 1, 4)] == pytest.approx(GAE_RET)
    assert adv[2:4] == [0.0, 0.0] and ret[2:4] == [0.0, 0.0]


def test_value_loss_clipping_golden():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0]])
    # token 0: unclipped (1 - 2)^2 = 1; clipped 0.5 + 0.2 = 0.7 -> (0.7 - 2)^2 = 1.69: the max
    # token 1: unclipped 0; clipped 0.5 - 0.2 = 0.3 -> 0.09: the max
    loss, m = value_loss(values, old, returns, torch.tensor([[1.0, 1.0]]), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * (1.69 + 0.09) / 2) and m["vf_clipfrac"] == 1.0
    loss, _ = value_loss(values, old, returns, torch.tensor([[1.0, 0.0]]), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * 1.69)  # the masked token counts nowhere
    loss, m = value_loss(values, old, returns, torch.tensor([[1.0, 1.0]]), clip=0.0)
    assert float(loss) == pytest.approx(0.5 * (1.0 + 0.0) / 2) and m["vf_clipfrac"] == 0.0
    # within the clip range the clipped and unclipped errors agree: nothing is clipped
    loss, m = value_loss(old + 0.1, old, returns, torch.tensor([[1.0, 1.0]]), clip=0.2)
    assert float(loss) == pytest.approx(0.5 * ((0.6 - 2) ** 2 + 0.6**2) / 2)
    assert m["vf_clipfrac"] == 0.0


def test_whiten_over_own_tokens_and_explained_variance():
    out = whiten([[1.0, 2.0, 7.0], [3.0]], [[1, 1, 0], [1]], eps=0.0)
    z = 1 / math.sqrt(2 / 3)  # own tokens 1, 2, 3: mean 2, population std sqrt(2/3)
    assert out[0] == pytest.approx([-z, 0.0, 0.0]) and out[1] == pytest.approx([z])
    assert whiten([[4.0, 4.0]], [[1, 1]], eps=1e-6) == [[0.0, 0.0]]  # constant: exactly 0
    r = torch.tensor([0.0, 1.0, 2.0])
    assert explained_variance(r, r) == 1.0
    assert explained_variance(torch.zeros(3), r) == 0.0
    assert math.isnan(explained_variance(r, torch.ones(3)))


def _trainer(path, critic: CriticConfig, **adv) -> TorchTrainer:
    torch.manual_seed(0)
    return TorchTrainer(
        path,
        OptimConfig(lr=1e-3),
        LossConfig(),
        TorchTrainerConfig(max_tokens_per_microbatch=64),
        total_steps=50,
        critic=critic,
        advantage=AdvantageConfig(estimator="gae", **adv),
    )


def _rewarded(make_samples, n=8, seed=1):
    samples = make_samples(n, seed=seed)
    for i, s in enumerate(samples):
        s.reward, s.advantage = float(i % 2), None
    return samples


def test_critic_learns_the_returns_and_gives_per_token_advantages(char_model_dir, make_samples):
    t = _trainer(char_model_dir, CriticConfig(lr=3e-3, value_clip=0.0), lam=1.0)
    samples = _rewarded(make_samples)
    first = t.train_step(samples)
    # zero-initialised head: every value 0, so the first advantages are the whitened rewards
    assert first["critic/value_mean"] == 0.0 and first["critic/return_mean"] > 0
    for s in samples:
        assert isinstance(s.advantage, list) and len(s.advantage) == s.response_length
        assert all(a == 0.0 for a, m in zip(s.advantage, s.loss_mask, strict=True) if not m)
        own = {a for a, m in zip(s.advantage, s.loss_mask, strict=True) if m}
        assert len(own) == 1 and (next(iter(own)) > 0) == (s.reward == 1.0)
    assert first["n_updates"] == 1.0 and first["critic/n_updates"] == 1.0
    losses = [t.train_step(samples)["critic/value_loss"] for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    last = t.train_step(samples)
    assert last["critic/explained_var"] > 0.5  # the values now track the returns


def test_num_critic_only_steps_hold_the_policy_and_checkpoints_resume_the_critic(
    char_model_dir, make_samples, tmp_path
):
    t = _trainer(char_model_dir, CriticConfig(lr=3e-3, num_critic_only_steps=1))
    before = {n: p.detach().clone() for n, p in t.named_parameters_for_sync()}
    m = t.train_step(_rewarded(make_samples))
    assert m["n_updates"] == 0.0 and m["critic/n_updates"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in t.named_parameters_for_sync())
    assert t.train_step(_rewarded(make_samples))["n_updates"] == 1.0
    assert not all(torch.equal(p, before[n]) for n, p in t.named_parameters_for_sync())

    t.save(tmp_path / "ckpt")
    probe = _rewarded(make_samples, seed=5)
    resumed = _trainer(char_model_dir, CriticConfig(lr=3e-3, num_critic_only_steps=1))
    assert resumed.critic.values(probe) != t.critic.values(probe)  # a fresh head: all 0
    resumed.load(tmp_path / "ckpt")
    assert resumed.critic.values(probe) == t.critic.values(probe)
    assert resumed.critic.steps == 2 and not resumed.critic.policy_waits


def test_a_checkpoint_without_a_critic_is_named(char_model_dir, tmp_path):
    plain = TorchTrainer(
        char_model_dir, OptimConfig(), LossConfig(), TorchTrainerConfig(), total_steps=5
    )
    plain.save(tmp_path / "plain")
    with pytest.raises(FileNotFoundError, match="has no critic"):
        _trainer(char_model_dir, CriticConfig()).load(tmp_path / "plain")


def test_megatron_refuses_the_critic_at_config_and_build_time(char_model_dir):
    with pytest.raises(ValueError, match="only the torch backend"):
        build_trainer(
            char_model_dir,
            OptimConfig(),
            LossConfig(),
            MegatronTrainerConfig(),
            5,
            critic=CriticConfig(),
            advantage=AdvantageConfig(estimator="gae"),
        )
    flags = ["--advantage.estimator=gae", "--agents", '[{"name": "a", "backend": "megatron"}]']
    with pytest.raises(ValueError, match=r"agents\['a'\].*only the torch backend"):
        train_config([*flags, "--data.path=x.jsonl"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("lr", 0.0), ("value_clip", -0.1), ("grad_clip", math.nan), ("num_critic_only_steps", -1)],
)
def test_critic_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"critic.{field}"):
        replace(CriticConfig(), **{field: value}).validate()
    with pytest.raises(ValueError, match="lam"):
        AdvantageConfig(estimator="gae", lam=1.5).validate()


def test_the_runs_one_critic_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match=r"critic\.scope must be model or run"):
        CriticConfig(scope="agent").validate()
    with pytest.raises(ValueError, match=r"critic\.shared puts a value head on one actor"):
        CriticConfig(scope="run", shared=True).validate()
    with pytest.raises(ValueError, match="warm-up of the run's one critic"):
        CriticConfig(scope="run", num_critic_only_steps=2).validate()


def test_a_centralized_critic_reads_the_global_state(char_model_dir, make_samples):
    """MAPPO: the critic reads metadata['global_state'] before the dialogue, so two samples
    differing only there get different values; an IPPO critic cannot tell them apart."""
    samples = _rewarded(make_samples)
    for s in samples:
        s.metadata["global_state"] = "state 1" if s.reward else "state 0"
    a, b = replace(samples[0], metadata={"global_state": "state 1"}), replace(samples[0])
    b.metadata = {"global_state": "state 0"}
    central = _trainer(char_model_dir, CriticConfig(lr=3e-3, centralized=True))
    independent = _trainer(char_model_dir, CriticConfig(lr=3e-3))
    for _ in range(3):
        central.train_step(samples)
        independent.train_step(samples)
    assert central.critic.values([a]) != central.critic.values([b])
    assert independent.critic.values([a]) == independent.critic.values([b])
    samples[3].metadata.pop("global_state")
    with pytest.raises(ValueError, match=r"g\d+/e\d+/.*metadata\['global_state'\]"):
        central.train_step(samples)


def test_a_critic_model_with_another_tokenizer_is_refused(char_model_dir, tiny_model_dir):
    with pytest.raises(ValueError, match="another tokenizer"):
        _trainer(char_model_dir, CriticConfig(model=str(tiny_model_dir)))


def _weights(t: TorchTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.named_parameters_for_sync()}


def test_a_shared_value_head_sits_on_the_actor_and_joins_its_loss(char_model_dir, make_samples):
    """critic.shared: no second body (the head reads the actor's), the critic's optimizer holds
    the head alone; the actor's update is that of policy + value_coef x value loss: at
    value_coef 0 exactly a separate critic's (same head, same values and advantages), above 0 the
    value loss moves the actor too; and the head learns the returns."""
    shared = _trainer(char_model_dir, CriticConfig(lr=3e-3, shared=True, value_coef=0.0))
    assert shared.critic.model.body is shared.model.get_decoder()
    head = {id(p) for p in shared.critic.model.head.parameters()}
    assert {id(p) for g in shared.critic.optimizer.param_groups for p in g["params"]} == head
    separate = _trainer(char_model_dir, CriticConfig(lr=3e-3))
    coupled = _trainer(char_model_dir, CriticConfig(lr=3e-3, shared=True, value_coef=1.0))
    runs = {}
    for name, t in (("shared", shared), ("separate", separate), ("coupled", coupled)):
        with torch.no_grad():  # the same non-zero head (a zero one passes no gradient back)
            t.critic.model.head.weight.copy_(torch.linspace(-1, 1, t.model.config.hidden_size))
        m = t.train_step(_rewarded(make_samples))
        assert m["n_updates"] == 1.0 and m["critic/n_updates"] == 1.0, name
        assert "critic/gae_mean" in m and "critic/value_loss" in m, name
        runs[name] = _weights(t)
    for n, w in runs["separate"].items():
        assert torch.allclose(runs["shared"][n], w, atol=1e-6), n
    assert any(
        not torch.allclose(runs["coupled"][n], w, atol=1e-6) for n, w in runs["separate"].items()
    )
    # the head learns the returns through the shared body
    t = _trainer(char_model_dir, CriticConfig(lr=3e-3, value_clip=0.0, shared=True), lam=1.0)
    samples = _rewarded(make_samples)
    losses = [t.train_step(samples)["critic/value_loss"] for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]


def test_a_shared_critics_warm_up_trains_the_head_alone_and_resumes(
    char_model_dir, make_samples, tmp_path
):
    cfg = CriticConfig(lr=3e-3, shared=True, num_critic_only_steps=1)
    t = _trainer(char_model_dir, cfg)
    before = _weights(t)
    head = t.critic.model.head.weight.detach().clone()
    m = t.train_step(_rewarded(make_samples))
    assert m["n_updates"] == 0.0 and m["critic/n_updates"] == 1.0
    assert all(torch.equal(p, before[n]) for n, p in t.named_parameters_for_sync())
    assert not torch.equal(t.critic.model.head.weight, head)
    assert t.train_step(_rewarded(make_samples))["n_updates"] == 1.0

    t.save(tmp_path / "ckpt")
    state = torch.load(tmp_path / "ckpt" / "critic.pt", weights_only=True)
    assert set(state["head"]) == {"weight", "bias"} and "model" not in state  # body: the actor's
    probe = _rewarded(make_samples, seed=5)
    resumed = _trainer(char_model_dir, cfg)
    resumed.load(tmp_path / "ckpt")
    assert resumed.critic.values(probe) == t.critic.values(probe)
    with pytest.raises(ValueError, match=r"critic is shared.*critic.shared is False"):
        _trainer(char_model_dir, CriticConfig()).load(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"critic.model.*critic.shared"):
        CriticConfig(model="x", shared=True).validate()
    with pytest.raises(ValueError, match=r"critic\.value_coef"):
        CriticConfig(value_coef=-1.0).validate()
