"""Config validation of the engine pieces: every bad value is refused naming its field."""

from __future__ import annotations

import pytest

from kernel.engine.__main__ import parse_config
from kernel.engine.launch import server_command
from kernel.engine.router import RouterConfig
from kernel.engine.settings import ServerConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"port": 0}, "port"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"context_length": 1}, "context_length"),
        ({"num_threads": 0}, "num_threads"),
        ({"log_level": "loud"}, "log_level"),
    ],
)
def test_server_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ServerConfig(**kwargs).validate()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"port": 70000}, "port"),
        ({"policy": "fastest"}, "policy"),
        ({"log_level": "warning"}, "log_level"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"worker_urls": ["127.0.0.1:1"]}, "worker_urls"),
    ],
)
def test_router_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RouterConfig(**kwargs).validate()


def test_server_flags_round_trip():
    config = ServerConfig(model="/m", port=1234, max_batch_size=8, weight_version="5")
    cmd = server_command(config)
    assert cmd[1:3] == ["-m", "kernel.engine"]
    assert parse_config(cmd[3:]) == config  # what launch_server passes is what serve reads
    assert "--tokenizer" not in cmd  # None values are left to their defaults
