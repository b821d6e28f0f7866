"""Ports a run hands to processes it starts: ``free_port`` picks one below the OS's ephemeral
range (where no outgoing connection can be handed it before the server binds it), and a
torch.distributed rendezvous ``listen``s before its port is handed out."""

from __future__ import annotations

import random

from kernel.engine.launch import bindable, ephemeral_start, free_port
from kernel.engine.process_group import listen


def test_free_port_lies_below_the_ephemeral_range_and_is_free():
    assert ephemeral_start() - 20000 >= 1000  # this machine leaves room (Linux: 32768)
    random.seed(0)
    first = free_port()
    random.seed(0)  # a run seeding the module's generator does not fix the port
    ports = {first} | {free_port() for _ in range(20)}
    assert len(ports) > 1
    assert all(20000 <= p < ephemeral_start() and bindable("127.0.0.1", p) for p in ports)


def test_a_listening_store_holds_its_port_until_it_is_gone():
    store = listen("127.0.0.1")  # port 0: the OS picks, read back
    port = store.port
    assert port > 0 and not bindable("127.0.0.1", port)
    del store
    assert bindable("127.0.0.1", port)
