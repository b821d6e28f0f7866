"""Secrets stay out of what a run writes: kernel.redact's rules, and a real (one-step toy) run
whose saved config.json hides a URL password and an API key given in its flags."""

from __future__ import annotations

import json
from pathlib import Path

from kernel.cli import train_config
from kernel.redact import redact, redact_url
from kernel.run.loop import train

TOY = Path(__file__).resolve().parent.parent / "kernel" / "presets" / "toy.yaml"


def test_redact_hides_url_passwords_and_secret_keys_only():
    cfg = {
        "model": "smollm2",
        "recipe_args": {
            "retriever_url": "http://bob:hunter2@10.0.0.1:8000/v1?q=1",
            "plain_url": "http://bob@10.0.0.1:8000",
            "judge_api_key": "sk-1",
            "hf_token": "hf_x",
            "db": {"password": "p", "client_secret": "s", "token": None},
            "urls": ["https://u:p@h/x", 3],
        },
        "rollout": {"max_tokens": 7, "tokenizer": "t", "check_tokens": 3},
    }
    assert redact(cfg) == {
        "model": "smollm2",
        "recipe_args": {
            "retriever_url": "http://bob:***@10.0.0.1:8000/v1?q=1",
            "plain_url": "http://bob@10.0.0.1:8000",
            "judge_api_key": "***",
            "hf_token": "***",
            "db": {"password": "***", "client_secret": "***", "token": None},
            "urls": ["https://u:***@h/x", 3],
        },
        "rollout": {"max_tokens": 7, "tokenizer": "t", "check_tokens": 3},
    }
    assert redact_url("http://[::1:80/x") == "***"  # unparsable: hidden whole
    assert redact_url("not a url: a:b@c") == "not a url: a:b@c"


def test_saved_config_json_hides_secrets(tmp_path):
    args = {"judge_url": "http://ann:hunter2@127.0.0.1:9/v1", "judge_api_key": "sk-secret"}
    flags = [f"--output_dir={tmp_path}", "--num_steps=1", f"--recipe_args={json.dumps(args)}"]
    cfg = train_config([f"--config={TOY}", *flags])
    train(cfg)
    text = (tmp_path / "config.json").read_text()
    assert "hunter2" not in text and "sk-secret" not in text
    saved = json.loads(text)["recipe_args"]
    assert saved == {"judge_url": "http://ann:***@127.0.0.1:9/v1", "judge_api_key": "***"}
    assert cfg.recipe_args == args  # the run itself used the real values
