"""Typed config: YAML and flags into dataclasses, validation naming the flag, the CLI."""

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from kernel.cli import train_config
from kernel.run.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def test_yaml_then_flags_override(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(
        yaml.safe_dump(
            {
                "num_steps": 5,
                "data": {"path": "x.jsonl", "n_samples_per_prompt": 2, "prompts_per_step": 3},
                "optim": {"lr": 1e-5},
                "advantage": {"estimator": "rloo"},
            }
        )
    )
    cfg = train_config([f"--config={cfg_file}", "--optim.lr=2e-5"])
    assert isinstance(cfg, TrainConfig)
    assert cfg.num_steps == 5 and cfg.optim.lr == 2e-5
    assert cfg.advantage.estimator == "rloo" and cfg.data.path == "x.jsonl"


def test_recipe_args_strings_stay_strings(tmp_path):
    """A recipe argument given as a string reaches the recipe as that string, from a flag's
    JSON and from YAML (jsonargparse reads strings inside a dict[str, Any] again as YAML)."""
    args = {"prefix": "def {f}(x):\n    return ", "n": "1", "k": 2, "sub": {"s": "a: b"}}
    cfg_file = tmp_path / "run.yaml"
    # the toy recipe has no config class: its hooks get recipe_args as they are
    hooks = {"generate_fn": "kernel.toy.generate", "reward_fn": "kernel.toy.reward"}
    run = {"recipe": "toy", **hooks, "recipe_args": args, "data": {"path": "x.jsonl"}}
    cfg_file.write_text(yaml.safe_dump(run))
    assert train_config([f"--config={cfg_file}"]).recipe_args == args
    flag = f"--recipe_args={json.dumps(args)}"
    assert train_config([f"--config={cfg_file}", flag]).recipe_args == args


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--optim.lr=0"], "optim.lr must be > 0"),
        (["--rollout.max_context_len=8", "--rollout.max_response_len=16"], "max_context_len"),
        (["--num_steps=0"], "num_steps must be >= 1"),
        (["--sync.check_tokens=-1"], "sync.check_tokens must be >= 0"),
        (["--sync.check_tolerance=0"], "sync.check_tolerance must be > 0"),
    ],
)
def test_validation_names_the_flag(flags, needle):
    with pytest.raises(ValueError, match=None) as e:
        train_config(["--data.path=x.jsonl", *flags])
    assert needle in str(e.value)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "kernel", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_help_info_and_config_errors():
    calls = [
        ("--help",),
        ("info",),
        ("config", "--data.path=x.jsonl", "--optim.lr=-1"),
        ("config", "--optim.lrr=1"),
        ("config", "--data.path=x.jsonl", "--num_steps=3"),
        ("train", "--preset", "nope"),
        ("train", "--preset", "toy", "--generate_fn=kernel.toy.nothing"),
        ("config", "--data.path=x.jsonl", "--recipe_args.verifier_reward=team"),
    ]
    with ThreadPoolExecutor(len(calls)) as pool:  # independent processes, started together
        help_out, info, bad, typo, good, no_preset, bad_hook, bad_recipe_arg = pool.map(
            lambda a: _cli(*a), calls
        )
    assert help_out.returncode == 0
    for cmd in ("info", "train", "eval", "config", "plot", "launch"):
        assert cmd in help_out.stdout
    assert info.returncode == 0
    assert "grpo" in info.stdout and "math_solver_verifier" in info.stdout
    assert bad.returncode == 2 and "optim.lr must be > 0" in bad.stderr
    assert typo.returncode == 2 and "lrr" in typo.stderr
    assert good.returncode == 0 and yaml.safe_load(good.stdout)["num_steps"] == 3
    assert no_preset.returncode == 2 and "--preset nope" in no_preset.stderr
    assert bad_hook.returncode == 2 and "kernel.toy.nothing" in bad_hook.stderr
    # recipe_args are the recipe config's fields, checked with the rest before anything starts
    assert bad_recipe_arg.returncode == 2
    assert "recipe_args.verifier_reward must be one of" in bad_recipe_arg.stderr


def test_a_commands_help_loads_neither_torch_nor_the_other_commands():
    """`kernel train --help` builds train's flags alone (not eval's, collect's, ... each a
    TrainConfig's worth) from config modules that import no torch, and lists every flag with
    its help text; `env serve --help` likewise. Whatever the command line, the process that
    prints help has not imported torch, the training loop or the environment server."""
    code = (
        "import sys\n"
        "from kernel.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('torch', 'transformers', 'fastapi', 'kernel.run.loop', 'kernel.env.server')\n"
        "print('LOADED', [m for m in heavy if m in sys.modules])\n"
    )
    for argv, needles in (
        (
            ["train", "--help"],
            [
                "--advantage.estimator {grpo,",
                "--trainer.share_prompts",
                "Samples with equal prompt ids",
            ],
        ),
        (["eval", "--help"], ["--checkpoint", "--loss.clip_low"]),
        (["--help"], ["Learning curves of a run to PNG."]),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120
        )
        text = " ".join(out.stdout.split())
        assert out.returncode == 0, out.stderr
        assert "LOADED []" in text, (argv, text[-300:])
        for needle in needles:
            assert needle in text, (argv, needle)


def test_the_command_table_is_the_parser_and_the_dispatch(monkeypatch, capfd):
    """kernel.cli.COMMANDS is the one list of subcommands: build_parser makes one per row, in
    its order and with its help line, and main runs the row's handler (env serve: the
    subcommand's row, with its own arguments)."""
    from jsonargparse import ArgumentParser

    from kernel import cli

    text = " ".join(cli.build_parser().format_help().split())
    assert "{" + ",".join(cli.COMMANDS) + "}" in text
    assert list(cli.COMMANDS)[:3] == ["info", "train", "eval"]
    for command in cli.COMMANDS.values():
        assert command.help in text
    calls = []

    def hello_parser() -> ArgumentParser:
        parser = ArgumentParser()
        parser.add_argument("--name", type=str, default="world")
        return parser

    def hello(args, argv):
        calls.append((args["name"], argv))

    def refuse(args, argv):
        raise ValueError("not today")

    rows = {
        "hello": cli.Command(hello_parser, hello, "Say hello."),
        "outer": cli.Command(
            ArgumentParser, None, "Holds inner.", {"inner": cli.Command(hello_parser, hello, "")}
        ),
        "refuse": cli.Command(ArgumentParser, refuse, "Refuses."),
    }
    monkeypatch.setattr(cli, "COMMANDS", {**cli.COMMANDS, **rows})
    cli.main(["hello", "--name", "there"])
    cli.main(["outer", "inner"])
    assert calls == [("there", ["hello", "--name", "there"]), ("world", ["outer", "inner"])]
    with pytest.raises(SystemExit) as e:  # a ValueError exits 2, naming the command
        cli.main(["refuse"])
    assert e.value.code == 2 and "refuse: not today" in capfd.readouterr().err


def test_ray_trainer_ranks_must_split_over_the_trainers_parallel_sizes(tmp_path):
    """Training on Ray without a plan: the ranks (ray.ranks) must divide by TP x PP of the
    agent's trainer section, refused before any actor starts."""
    agents = json.dumps(
        [{"name": "default", "backend": "megatron", "trainer": {"tensor_parallel": 2}}]
    )
    flags = [
        f"--output_dir={tmp_path}",
        f"--agents={agents}",
        "--ray.enabled=true",
        "--ray.ranks=3",
    ]
    cfg = train_config(["--preset", "toy", *flags])
    with pytest.raises(ValueError, match=r"agents\['default'\]: 3 trainer ranks .* = 2 x 1"):
        cfg.plan().check_ray_ranks()
    cfg.plan().check_ray_ranks(placed={"default"})  # kernel launch's plan places it: its check


@pytest.mark.parametrize(
    "preset",
    sorted(Path(__file__).resolve().parents[1].glob("*/presets/*.yaml"))
    + sorted(Path(__file__).resolve().parents[1].glob("recipes/*/presets/*.yaml")),
    ids=lambda p: f"{p.parent.parent.name}/{p.stem}",
)
def test_every_preset_passes_its_checks(preset):
    """Each shipped preset loads and validates as it is (its recipe config included: the
    plan builds it)."""
    plan = train_config([f"--config={preset}"]).plan()
    assert plan.recipe is not None


def test_the_run_plan_resolves_every_agent_and_model_once(tmp_path):
    """TrainConfig.plan(): one ModelPlan per model (owner first, sharers after) with the
    owner's overrides in its settings and each agent's own rollout overrides; immutable."""
    import dataclasses

    agents = [
        {"name": "doctor", "optim": {"lr": 3e-4}, "rollout": {"max_response_len": 12}},
        {"name": "nurse", "share_model_with": "doctor", "rollout": {"top_p": 0.9}},
        {"name": "patient", "trainable": False, "rollout": {"temperature": 0.0}},
    ]
    flags = [f"--output_dir={tmp_path}", f"--agents={json.dumps(agents)}", "--rollout.top_p=0.95"]
    plan = train_config(["--preset", "toy", *flags]).plan()
    assert [m.owner for m in plan.models] == ["doctor", "patient"]
    doctor, patient = plan.models
    assert [s.name for s in doctor.agents] == ["doctor", "nurse"] and doctor.trained
    assert doctor.settings.optim.lr == 3e-4 and patient.settings.optim.lr != 3e-4
    assert plan.rollout("doctor").max_response_len == 12 and plan.rollout("doctor").top_p == 0.95
    assert plan.rollout("nurse").top_p == 0.9 and plan.rollout("nurse").max_response_len != 12
    assert plan.model_of("nurse") is doctor and not patient.trained
    assert patient.temperature == 0.0  # frozen: greedy is allowed
    assert [s.name for s in plan.agents] == ["doctor", "nurse", "patient"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.models = ()  # type: ignore[misc]


def test_lora_gives_each_trainable_agent_of_a_model_its_own_adapter(tmp_path):
    """lora.rank > 0 on a model's owner: one adapter per trainable agent of that model (its
    own overrides applied), none for its frozen agents; the model's engines serve adapters."""
    agents = [
        {"name": "solver", "lora": {"rank": 8}},
        {"name": "verifier", "share_model_with": "solver", "lora": {"rank": 4, "alpha": 8}},
        {"name": "judge", "share_model_with": "solver", "trainable": False},
        {"name": "critic"},  # its own model, trained in full
    ]
    flags = [f"--output_dir={tmp_path}", f"--agents={json.dumps(agents)}"]
    plan = train_config(["--preset", "toy", *flags]).plan()
    solver, critic = plan.models
    assert sorted(solver.adapters) == ["solver", "verifier"] and not critic.adapters
    assert solver.adapters["solver"].rank == 8 and solver.adapters["verifier"].rank == 4
    assert solver.adapters["verifier"].alpha == 8 and solver.adapters["solver"].alpha == 32
    engine = solver.settings.engine
    assert engine.enable_lora and engine.max_lora_rank == 8 and engine.lora_target_modules
    assert not critic.settings.engine.enable_lora


@pytest.mark.parametrize(
    ("agents", "flags", "needle"),
    [
        ([{"name": "x", "lora": {"rank": -1}}], [], "lora.rank must be >= 0"),
        ([{"name": "x", "lora": {"rank": 8, "ranks": 2}}], [], "unknown key(s) ['ranks']"),
        (
            [{"name": "x"}, {"name": "y", "share_model_with": "x", "lora": {"rank": 4}}],
            [],
            "the model of 'x' trains in full",
        ),
        (
            [
                {"name": "x", "lora": {"rank": 8}},
                {"name": "y", "share_model_with": "x", "lora": {"rank": 0}},
            ],
            [],
            "agents['y'].lora.rank is 0",
        ),
        ([{"name": "x", "lora": {"rank": 8}, "backend": "megatron"}], [], "torch backend"),
        ([{"name": "ra", "lora": {"rank": 8}}], [], "inside peft's prefix 'lora_'"),
        ([{"name": "x", "lora": {"rank": 8}}], ["--async_mode=true"], "async_mode"),
        ([{"name": "x", "lora": {"rank": 8}}], ["--advantage.estimator=gae"], "estimator gae"),
    ],
)
def test_lora_settings_that_cannot_train_fail_naming_the_agent(tmp_path, agents, flags, needle):
    flags = [f"--output_dir={tmp_path}", f"--agents={json.dumps(agents)}", *flags]
    with pytest.raises(ValueError) as e:
        train_config(["--preset", "toy", *flags]).plan()
    assert needle in str(e.value)


def test_info_lists_the_model_names_a_preset_may_use(capfd):
    from kernel.cli import main

    main(["info"])
    out = " ".join(capfd.readouterr().out.split())
    assert "smollm2" in out and "tiny-<char|smollm2>[-<qwen2|qwen3|llama>]" in out


def test_agent_flags_set_one_field_of_a_spec_over_the_preset():
    """``--agent NAME.FIELD=VALUE`` (what the run.sh files pass instead of JSON built in bash):
    a field, one key of a section or a whole section (VALUE is YAML), in order; a bare name
    keeps sharing the first agent's model; the plan reads what was set."""
    cfg = train_config(
        [
            "--recipe=debate",
            "--preset=cpu",
            "--agent=alice.resources={train_gpus: 2, infer_gpus: 2}",
            "--agent=alice.resources.infer_gpus=3",
            "--agent=alice.trainer.ppo_epochs=2",
            "--agent=bob.trainable=false",
            "--agent=bob.rollout.max_response_len=17",
        ]
    )
    alice, bob = cfg.agent_specs()
    assert alice.resources == {"train_gpus": 2, "infer_gpus": 3}
    assert alice.trainer == {"ppo_epochs": 2}
    assert bob.share_model_with == "alice" and not bob.trainable
    (model,) = cfg.plan().models
    assert model.resources.infer_gpus == 3 and model.settings.trainer.ppo_epochs == 2
    assert model.rollouts["bob"].max_response_len == 17
    assert model.rollouts["alice"].max_response_len == cfg.rollout.max_response_len


@pytest.mark.parametrize(
    "flag, needle",
    [
        ("carol.backend=torch", "--agent carol.backend=torch: no agent 'carol' in this run"),
        ("alice.backend", "give NAME.FIELD=VALUE"),
        ("alice=1", "give NAME.FIELD=VALUE"),
        ("alice.backend.kind=x", "'backend' is not a section"),
        ("alice.rollout=[1, 2", "VALUE is not YAML"),
        ("alice.colour=red", "agents[0]: unknown key 'colour'"),
        ("alice.rollout.concurrency=4", "agents['alice'].rollout.concurrency: rollout.concur"),
        ("bob.optim.lr=1e-5", "agents['bob'].optim.lr: agents['bob'] shares the model of 'alice'"),
    ],
)
def test_bad_agent_flags_fail_naming_the_flag_or_field(flag, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        train_config(["--recipe=debate", "--preset=cpu", f"--agent={flag}"])
