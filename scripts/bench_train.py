"""Benchmark: training tokens/s of TorchTrainer.train_step next to a plain training loop.

Both run the same model (two copies from the same checkpoint) on the same batch of samples of
varied lengths, in the same process. The plain loop is what one writes by hand: for each of the
trainer's micro-batches, forward with full logits, log-softmax, gather the response tokens,
-advantage x logprob, backward; then clip, AdamW step, zero_grad. The ratio trainer / plain
shows what the trainer's bookkeeping (planning, per-sample layout, policy loss, metrics) costs.
Also printed: the non-padding share of the trainer's micro-batch token slots, and that of a
naive split (arrival order, the same number of micro-batches, rows padded to the longest).

    .venv/bin/python scripts/bench_train.py                       # tiny char model on CPU
    .venv/bin/python scripts/bench_train.py --pack --hidden 512 --device cuda
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch

from kernel.loss import LossConfig
from kernel.models import build_tiny_model, load_causal_lm
from kernel.sample import Sample, Status
from kernel.train.batching import collate, plan_microbatches
from kernel.train.optim import OptimConfig
from kernel.train.settings import TorchTrainerConfig
from kernel.train.torch_backend import TorchTrainer


def make_batch(n: int, vocab: int, prompt: tuple[int, int], response: tuple[int, int], seed: int):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, r = rng.randint(*prompt), rng.randint(*response)
        out.append(
            Sample(
                prompt_ids=[rng.randrange(vocab) for _ in range(p)],
                response_ids=[rng.randrange(vocab) for _ in range(r)],
                loss_mask=[1] * r,
                advantage=rng.gauss(0.0, 1.0),
                status=Status.COMPLETED,
                index=i,
            )
        )
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_step(model, opt, microbatches, advantages, device) -> None:
    """One hand-written update over the micro-batches: sum of -A * logprob / response tokens."""
    n = sum(int(mb.keep.sum()) for mb in microbatches)
    for mb, adv in zip(microbatches, advantages, strict=True):
        logits = model(
            input_ids=mb.input_ids.to(device),
            attention_mask=None if mb.attention_mask is None else mb.attention_mask.to(device),
            position_ids=mb.position_ids.to(device),
            use_cache=False,
        ).logits  # (B, L, V)
        logp = torch.log_softmax(logits[mb.keep.to(device)].float(), -1)  # (N, V)
        lp = logp.gather(-1, mb.targets.to(device)[:, None]).squeeze(-1)  # (N,)
        (-(adv.to(device)[mb.seq.to(device)] * lp).sum() / n).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="HF model path; default: build a tiny qwen2")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size of the built model")
    ap.add_argument("--layers", type=int, default=4, help="layers of the built model")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 64))
    ap.add_argument("--response-len", type=int, nargs=2, default=(16, 256))
    ap.add_argument("--budget", type=int, default=2048, help="max_tokens_per_microbatch")
    ap.add_argument("--pack", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--steps", type=int, default=8, help="timed steps (after one warm-up)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or str(
            build_tiny_model(
                tmp,
                "qwen2",
                tokenizer="char",
                hidden_size=args.hidden,
                num_layers=args.layers,
                num_heads=max(1, args.hidden // 64),
                num_kv_heads=max(1, args.hidden // 128),
                intermediate_size=3 * args.hidden,
            )
        )
        optim = OptimConfig(lr=1e-6, dtype=args.dtype)
        cfg = TorchTrainerConfig(
            max_tokens_per_microbatch=args.budget, pack_sequences=args.pack, device=args.device
        )
        trainer = TorchTrainer(path, optim, LossConfig(), cfg, total_steps=args.steps + 1)
        device = trainer.device
        model = load_causal_lm(path, "float32", str(device)).train()
    vocab = model.config.vocab_size
    batch = make_batch(args.samples, vocab, args.prompt_len, args.response_len, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=args.dtype == "bfloat16")

    lengths = [len(s.prompt_ids) + s.response_length for s in batch]
    plan = plan_microbatches(lengths, args.budget, args.pack)  # the trainer's own plan
    mbs = [collate([batch[i] for i in g], g, args.pack) for g in plan]
    advs = [torch.tensor([batch[i].advantage for i in mb.indices]) for mb in mbs]
    rows = -(-len(batch) // len(mbs))  # as many micro-batches, filled in arrival order
    naive = [collate(batch[k : k + rows], [], pack=False) for k in range(0, len(batch), rows)]
    tokens = sum(len(s.prompt_ids) + s.response_length for s in batch)

    metrics = {}

    def trainer_step():
        metrics.update(trainer.train_step(batch))

    def loop_step():
        with autocast:
            plain_step(model, opt, mbs, advs, device)

    def timed(step) -> float:
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        return time.perf_counter() - t0

    # Alternate the two, step by step, so that drifting machine load hits both alike; the
    # first round warms up kernels and allocators.
    t_trainer, t_plain = [], []
    for i in range(args.steps + 1):
        a, b = timed(trainer_step), timed(loop_step)
        if i:
            t_trainer.append(a)
            t_plain.append(b)
    # Median over steps; the best step too, since a shared machine only ever slows steps down.
    tps_trainer, best_trainer = tokens / statistics.median(t_trainer), tokens / min(t_trainer)
    tps_plain, best_plain = tokens / statistics.median(t_plain), tokens / min(t_plain)
    naive_frac = tokens / sum(mb.n_slots for mb in naive)
    print(
        f"device {device}, dtype {args.dtype}, model {path if args.model else 'tiny qwen2'} "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), "
        f"{len(batch)} samples, {tokens} tokens, budget {args.budget}, pack {args.pack}, "
        f"{len(mbs)} micro-batches"
    )
    print(f"TorchTrainer.train_step  {tps_trainer:10.0f} tokens/s  (best step {best_trainer:.0f})")
    print(f"plain loop               {tps_plain:10.0f} tokens/s  (best step {best_plain:.0f})")
    print(
        f"ratio trainer / plain    {tps_trainer / tps_plain:10.2f}x  (best steps "
        f"{best_trainer / best_plain:.2f}x; target >= 0.9x)"
    )
    print(
        f"non-padding fraction     {metrics['nonpad_frac']:10.3f}   (target >= 0.9; "
        f"naive arrival-order split: {naive_frac:.3f})"
    )


if __name__ == "__main__":
    main()
