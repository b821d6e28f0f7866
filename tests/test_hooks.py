"""Hook loading by dotted path: good paths resolve once; every bad one names the path."""

import asyncio
from pathlib import Path

import pytest

from kernel.hooks import HookError, RolloutContext, call_reward, load_generate, load_reward
from kernel.sample import Sample

FIX = "tests.hook_fixtures"


def test_good_paths_resolve_and_are_cached():
    g = load_generate(f"{FIX}.generate")
    assert g is load_generate(f"{FIX}.generate")
    s = Sample(agent="a")
    assert asyncio.run(g(RolloutContext(), s)) == [s]
    assert load_reward(f"{FIX}.reward")(RolloutContext(), [s, s]) == 2.0


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("nodots", "is not a dotted path"),
        ("tests.no_such_module.generate", "cannot import module 'tests.no_such_module'"),
        (f"{FIX}.missing", "has no attribute 'missing'"),
        (f"{FIX}.NOT_A_FUNCTION", "is a int, not a function"),
        (f"{FIX}.sync_generate", "must be 'async def'"),
        (f"{FIX}.generate_one_arg", "must accept 2 positional arguments"),
    ],
)
def test_bad_generate_paths_fail_naming_the_path(path, needle):
    with pytest.raises(HookError) as e:
        load_generate(path)
    assert needle in str(e.value)
    assert repr(path) in str(e.value) or path in str(e.value)


def test_async_reward_is_awaited():
    fn = load_reward(f"{FIX}.async_reward")
    out = asyncio.run(call_reward(fn, RolloutContext(), [Sample(agent="doctor")]))
    assert out == {"doctor": 1.0}
    sync = load_reward(f"{FIX}.reward")
    assert asyncio.run(call_reward(sync, RolloutContext(), [Sample()])) == 1.0


def test_recipe_config_is_built_and_validated_at_start_up():
    from kernel.hooks import default_recipe_config, load_recipe_config

    assert load_recipe_config(None, {"a": 1}) == {"a": 1}
    cfg = load_recipe_config(f"{FIX}.RecipeConfig", {"turns": 3})
    assert cfg.turns == 3
    with pytest.raises(HookError, match=r"recipe_args do not fit tests\.hook_fixtures"):
        load_recipe_config(f"{FIX}.RecipeConfig", {"turnz": 3})
    with pytest.raises(ValueError, match=r"recipe_args\.turns must be >= 1"):
        load_recipe_config(f"{FIX}.RecipeConfig", {"turns": 0})
    assert default_recipe_config("no_such_recipe") is None


def test_recipes_and_their_data_are_found_by_import_not_by_the_working_directory(
    tmp_path, monkeypatch
):
    import recipes
    from kernel.hooks import package_file, recipes_root

    monkeypatch.chdir(tmp_path)  # nowhere near the checkout
    assert recipes_root() == Path(recipes.__file__).parent
    rel = "recipes/takes_two/data/train.jsonl"
    found = Path(package_file(rel))
    assert found.is_absolute() and found == recipes_root().parent / rel and found.exists()
    assert Path(package_file("kernel/presets/toy.yaml")).exists()
    (tmp_path / "recipes").mkdir()  # a file in the working directory wins
    (tmp_path / rel.replace("takes_two/data/", "")).write_text("{}\n")
    assert package_file("recipes/train.jsonl") == "recipes/train.jsonl"
    assert package_file("nowhere/x.jsonl") == "nowhere/x.jsonl"  # the buffer names it
    assert package_file(str(found)) == str(found)


def test_recipe_args_are_read_as_their_fields_types_or_refused_naming_the_key():
    """``--recipe_args.max_turns 3`` arrives as the string "3": a recipe config dataclass gets
    the int (it crashed inside validate with a TypeError); a string field keeps "1" a string;
    a value that does not fit its field is refused naming the key."""
    from kernel.hooks import load_recipe_config

    cfg = load_recipe_config("recipes.deep_research.config.RecipeConfig", {"max_turns": "3"})
    assert cfg.max_turns == 3
    pair = load_recipe_config("recipes.code_pair.config.RecipeConfig", {"workflow": "single"})
    assert pair.workflow == "single"
    with pytest.raises(HookError, match=r"recipe_args\.max_turns: 'three' does not fit"):
        load_recipe_config("recipes.deep_research.config.RecipeConfig", {"max_turns": "three"})
