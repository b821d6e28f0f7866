"""Several agents with their own models in one run (kernel.run.agents.AgentSpec, kernel.run.loop).

The two-agent toy (kernel/presets/toy_duo.yaml): a doctor and a patient, each a tiny model with
its own engine, trainer and weight sync. The patient is rewarded for answering with facts
(digits); the doctor for asking in words AND getting facts back. Both rewards must rise, and
freezing the patient (the ablation) must leave the doctor measurably worse off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.cli import train_config
from kernel.hooks import RolloutContext
from kernel.run.agents import AgentSpec, agent_specs, model_groups
from kernel.run.config import TrainConfig
from kernel.run.loop import train
from kernel.sample import Sample
from kernel.toy import duo_reward

ROOT = Path(__file__).resolve().parent.parent
DUO = ROOT / "kernel" / "presets" / "toy_duo.yaml"
FROZEN_PATIENT = (
    '--agents=[{"name":"doctor","model":"tiny-char"},'
    '{"name":"patient","model":"tiny-char","trainable":false}]'
)


def duo_config(tmp_path, *flags):
    return train_config([f"--config={DUO}", f"--output_dir={tmp_path}", *flags])


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


# ---------------------------------------------------------------- specs and validation


def test_bare_names_share_the_first_agents_model():
    groups = model_groups(agent_specs(["solver", "rewriter", "selector"]))
    assert list(groups) == ["solver"]
    assert [s.name for s in groups["solver"]] == ["solver", "rewriter", "selector"]


def test_full_specs_get_their_own_models_unless_they_share():
    specs = agent_specs(
        [AgentSpec("doctor"), AgentSpec("patient", model="tiny-char"), "nurse"]
    )  # a bare name after specs shares the first agent's model
    groups = model_groups(specs)
    assert {k: [s.name for s in v] for k, v in groups.items()} == {
        "doctor": ["doctor", "nurse"],
        "patient": ["patient"],
    }


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ([AgentSpec("a"), AgentSpec("a")], "distinct names"),
        ([AgentSpec("a"), AgentSpec("b", share_model_with="zz")], "'zz', which is not an agent"),
        (
            [
                AgentSpec("a"),
                AgentSpec("b", share_model_with="a"),
                AgentSpec("c", share_model_with="b"),
            ],
            "share with 'a' directly",
        ),
        (
            [AgentSpec("a"), AgentSpec("b", share_model_with="a", optim={"lr": 1e-3})],
            "agents['b'].optim.lr: agents['b'] shares the model of 'a', so it must be set on 'a'",
        ),
        ([AgentSpec("a", update_every=0)], "agents['a'].update_every must be >= 1"),
        ([AgentSpec("a", backend="jax")], "agents['a'].backend must be one of"),
        ([AgentSpec("a b")], "name must be letters"),
    ],
)
def test_bad_agent_specs_fail_naming_the_agent_and_field(agents, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        agent_specs(agents)


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ([AgentSpec("a", optim={"learning_rate": 1.0})], r"agents\['a'\].optim: unknown key"),
        # a value of the wrong type names agent, section, field, value and the type expected
        (
            [AgentSpec("a", optim={"lr": "fast"})],
            r"agents\['a'\].optim.lr: 'fast' is not a valid float",
        ),
        (
            [AgentSpec("a", optim={"weight_decay": [1]})],
            r"agents\['a'\].optim.weight_decay: \[1\] is not a valid float",
        ),
        (
            [AgentSpec("a", trainer={"max_tokens_per_microbatch": "many"})],
            r"agents\['a'\].trainer.max_tokens_per_microbatch: 'many' is not a valid int",
        ),
        ([AgentSpec("a", loss={"clip_eps": -1.0})], r"agents\['a'\].loss"),
        ([AgentSpec("a", engine={"num_engines": 0})], r"agents\['a'\].engine"),
        ([AgentSpec("a", rollout={"top_p": 2.0})], r"agents\['a'\].rollout"),
        (
            [AgentSpec("a"), AgentSpec("b", share_model_with="a", rollout={"temperature": 0.5})],
            "train at one temperature",
        ),
        ([AgentSpec("a", rollout={"temperature": 0.0})], "freeze the agent"),
        ([AgentSpec("a", backend="megatron"), AgentSpec("b")], "megatron backend trains one"),
    ],
)
def test_bad_overrides_fail_before_anything_starts(agents, message):
    cfg = TrainConfig(agents=agents, data=TrainConfig().data)
    cfg.data.path = "x.jsonl"
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_override_values_are_read_as_their_fields_type():
    """A YAML string that is a number is the number ("1e-5" for a float, as the top-level flags
    read it), so the lax reading accepts what a user writes and refuses what cannot be meant."""
    cfg = TrainConfig(agents=[AgentSpec("a", optim={"lr": "1e-5"}, rollout={"top_p": 1})])
    cfg.data.path = "x.jsonl"
    owner = cfg.validate().agent_specs()[0]
    assert cfg.model_settings(owner).optim.lr == 1e-5
    assert cfg.agent_rollout(owner).top_p == 1.0


def test_overrides_apply_per_model_and_per_agent():
    cfg = TrainConfig(
        agents=[
            AgentSpec("doctor", optim={"lr": 3e-4}, trainer={"max_tokens_per_microbatch": 512}),
            AgentSpec("patient", model="tiny-char", rollout={"temperature": 0.7}),
            AgentSpec("nurse", share_model_with="doctor", rollout={"max_response_len": 32}),
            AgentSpec(
                "greedy", share_model_with="doctor", trainable=False, rollout={"temperature": 0.0}
            ),
        ]
    )
    doctor, patient, nurse, greedy = cfg.agent_specs()
    assert cfg.model_settings(doctor).optim.lr == 3e-4
    assert cfg.model_settings(doctor).trainer.max_tokens_per_microbatch == 512
    assert cfg.model_settings(patient).optim.lr == cfg.optim.lr  # not the doctor's
    assert cfg.model_settings(patient).model == "tiny-char"
    assert cfg.model_settings(doctor).model == cfg.model
    assert cfg.agent_rollout(patient).temperature == 0.7
    assert cfg.agent_rollout(nurse).max_response_len == 32
    assert cfg.agent_rollout(nurse).temperature == cfg.rollout.temperature
    # a frozen agent may sample greedily on a shared model; the others still train at 1.0
    cfg.data.path = "x.jsonl"
    cfg.validate()
    assert cfg.agent_rollout(greedy).temperature == 0.0


def test_duo_reward_goldens():
    """The doctor's reward depends on the patient's answer; the patient's on its own."""

    def episode(question: str, answer: str):
        return [
            Sample(agent="doctor", metadata={"text": question}),
            Sample(agent="patient", metadata={"text": answer}),
        ]

    ctx = RolloutContext()
    # "ab?d": 3 letters of 4 -> ask 0.75; "12x4": 3 digits of 4 -> info 0.75
    assert duo_reward(ctx, episode("ab?d", "12x4")) == {"doctor": 0.75, "patient": 0.75}
    # a perfect question gets nothing more than half when the answer holds no facts
    assert duo_reward(ctx, episode("abcd", "xyz")) == {"doctor": 0.5, "patient": 0.0}
    assert duo_reward(ctx, episode("", "")) == {"doctor": 0.0, "patient": 0.0}


# ---------------------------------------------------------------- the two-agent toy, trained


@pytest.mark.slow
def test_doctor_and_patient_learn_together_and_freezing_the_patient_shows(tmp_path):
    rows = train(duo_config(tmp_path / "both"))
    frozen = train(duo_config(tmp_path / "frozen", FROZEN_PATIENT))

    # both agents' rewards rise when both train
    assert mean(rows[:5], "doctor/reward") <= 0.45
    assert mean(rows[-5:], "doctor/reward") >= 0.8
    assert mean(rows[:5], "patient/reward") <= 0.25
    assert mean(rows[-5:], "patient/reward") >= 0.75
    # with the patient frozen, the patient does not move and the doctor tops out near
    # (1 + the patient's ~0.1 digit share) / 2
    assert abs(mean(frozen[-5:], "patient/reward") - mean(frozen[:5], "patient/reward")) < 0.1
    assert mean(frozen[-5:], "doctor/reward") < mean(rows[-5:], "doctor/reward") - 0.2
    assert all(r["weight_version/patient"] == 0 for r in frozen)
    assert not any(k.startswith("train/patient/") for r in frozen for k in r)

    # each model trained on its own agent's samples only, on-policy to its own engine
    n = 4 * 8  # prompts_per_step x n_samples_per_prompt episodes, one sample per agent each
    for r in rows:
        assert r["train/doctor/n_samples"] == n and r["train/patient/n_samples"] == n
        assert r["train/doctor/logprob_diff"] < 1e-4 and r["train/patient/logprob_diff"] < 1e-4
    assert [r["weight_version/doctor"] for r in rows] == list(range(1, len(rows) + 1))
    # per-agent checkpoints, and engine logs per model
    last = tmp_path / "both" / "checkpoints" / f"step_{len(rows)}"
    assert {p.name for p in (last / "trainers").iterdir()} == {"doctor", "patient"}
    state = json.loads((last / "state.json").read_text())
    assert state["weight_versions"] == {"doctor": len(rows), "patient": len(rows)}
    assert (tmp_path / "both" / "logs" / "patient" / "engine0.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("estimator", "doctor_last", "patient_last"),
    # measured (seed 42, 40 steps): marloo 0.33 -> 0.88 / 0.12 -> 0.92;
    # mareinforce, no baseline, slower: 0.32 -> 0.64 / 0.11 -> 0.58
    [("marloo", 0.75, 0.75), ("mareinforce", 0.5, 0.4)],
)
def test_comlrl_family_learns_the_duo_with_both_agents_rising(
    tmp_path, estimator, doctor_last, patient_last
):
    rows = train(duo_config(tmp_path, f"--advantage.estimator={estimator}"))
    assert mean(rows[:5], "doctor/reward") <= 0.45 and mean(rows[:5], "patient/reward") <= 0.25
    assert mean(rows[-5:], "doctor/reward") >= doctor_last
    assert mean(rows[-5:], "patient/reward") >= patient_last


@pytest.mark.slow
def test_ippo_one_critic_per_agent_learns_the_duo_with_both_agents_rising(tmp_path):
    """IPPO: advantage.estimator gae gives each agent's model its own critic, on its own view;
    both agents' rewards rise and each critic follows its own agent's returns."""
    rows = train(duo_config(tmp_path, "--advantage.estimator=gae", "--critic.lr=0.002"))
    assert mean(rows[:5], "doctor/reward") <= 0.45 and mean(rows[:5], "patient/reward") <= 0.25
    assert mean(rows[-5:], "doctor/reward") >= 0.75
    assert mean(rows[-5:], "patient/reward") >= 0.75
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for agent in ("doctor", "patient"):
        value = f"train/{agent}/critic/value_mean"
        assert logged[0][value] == 0.0 and mean(logged[-5:], value) >= 0.6


@pytest.mark.slow
def test_maac_one_critic_for_both_agents_learns_the_duo_and_resumes(tmp_path):
    """MAAC (critic.scope run): ONE critic over the global state values both agents' samples
    and trains on both agents' returns; both rewards rise as with IPPO, the trainers carry no
    critic of their own, and a resumed run continues the critic the checkpoint saved (a new
    one would value everything 0.0 at its first step: its head starts at zero)."""
    flags = ["--advantage.estimator=gae", "--critic.lr=0.002", "--critic.scope=run"]
    flags += ["--critic.centralized=true", "--save_every=10"]
    rows = train(duo_config(tmp_path, *flags))
    assert mean(rows[:5], "doctor/reward") <= 0.45 and mean(rows[:5], "patient/reward") <= 0.25
    assert mean(rows[-5:], "doctor/reward") >= 0.75
    assert mean(rows[-5:], "patient/reward") >= 0.75
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["critic/value_mean"] == 0.0 and mean(logged[-5:], "critic/value_mean") >= 0.6
    assert not any(
        k.startswith(("train/doctor/critic", "train/patient/critic")) for k in logged[-1]
    )
    assert (tmp_path / "checkpoints" / "step_40" / "critic" / "critic.pt").exists()
    more = train(duo_config(tmp_path, *flags, "--num_steps=42", "--resume=true"))
    assert [r["step"] for r in more] == [40, 41] and more[0]["critic/value_mean"] >= 0.5


def test_maac_refuses_models_whose_tokenizers_differ(tmp_path):
    agents = (
        '--agents=[{"name":"doctor","model":"tiny-char"},{"name":"patient","model":"tiny-smollm2"}]'
    )
    flags = ["--advantage.estimator=gae", "--critic.scope=run", agents, "--num_steps=1"]
    with pytest.raises(ValueError, match=r"tokenizer of 'patient'.*critic\.scope model"):
        train(duo_config(tmp_path, *flags))


@pytest.mark.slow
def test_update_every_heterogeneous_models_and_resume(tmp_path):
    """The patient is another family (SmolLM2's tokenizer, a Llama body) trained every 2nd step;
    a resumed run continues each model's weight versions from its own checkpoint."""
    agents = (
        '--agents=[{"name":"doctor","model":"tiny-char"},'
        '{"name":"patient","model":"tiny-smollm2-llama","update_every":2}]'
    )
    flags = [agents, "--data.prompts_per_step=2", "--data.n_samples_per_prompt=2"]
    rows = train(duo_config(tmp_path, *flags, "--num_steps=3", "--save_every=1"))
    assert [r["weight_version/doctor"] for r in rows] == [1, 2, 3]
    assert [r["weight_version/patient"] for r in rows] == [1, 1, 2]  # trained at steps 0, 2
    assert ["train/patient/loss" in r for r in rows] == [True, False, True]
    assert all("train/doctor/loss" in r for r in rows)

    resumed = train(duo_config(tmp_path, *flags, "--num_steps=5", "--resume=true"))
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r["weight_version/doctor"] for r in resumed] == [4, 5]
    assert [r["weight_version/patient"] for r in resumed] == [2, 3]  # step 3 skips, 4 trains


def test_an_agents_chat_template_replaces_the_tokenizers_for_its_dialogues(tmp_path):
    from kernel.models import char_tokenizer
    from kernel.run.runtime import with_template

    tok = char_tokenizer()
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    file = tmp_path / "plain.jinja"
    file.write_text(template)
    for given in (template, str(file)):
        mine = with_template(tok, given)
        text = mine.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        assert text == "[user] hi\n"
    assert tok.chat_template != template  # the model's own tokenizer is left as it was
    assert with_template(tok, None) is tok
    with pytest.raises(ValueError, match="neither a Jinja template nor a file"):
        with_template(tok, str(tmp_path / "missing.jinja"))


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_an_agent_that_never_spoke_is_paid_by_a_reward_only_sample(tmp_path, estimator):
    """The patient of tests/hook_fixtures/silent.py speaks in half the episodes of each group;
    in the others ``Dialogue.sample(reward_only=True)`` gives it a sample without response
    tokens: the reward hook pays it, it counts in ``patient/samples`` and in the advantages,
    and the trainer trains the spoken half only (the other half skipped, not an error)."""
    flags = [
        f"--config={DUO}",
        f"--output_dir={tmp_path}",
        "--num_steps=1",
        "--generate_fn=tests.hook_fixtures.silent.generate",
        "--reward_fn=tests.hook_fixtures.silent.reward",
        f"--advantage.estimator={estimator}",
    ]
    (row,) = train(train_config(flags))
    assert row["doctor/samples"] == row["patient/samples"] == 32
    assert row["adv/n_samples"] == 64 and row["adv/n_excluded"] == 0
    assert row["train/patient/n_samples"] == 16 and row["train/patient/n_skipped"] == 16
    assert row["train/doctor/n_skipped"] == 0
    # the 16 silent episodes are paid 1.0, the 16 spoken ones their share of digits (< 1)
    assert 0.5 <= row["patient/reward"] < 1.0
