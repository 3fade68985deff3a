"""A short LoRA run on MiniLM that writes checkpoints as a trainer that saves the full model does.

Rank 8 on every layer's query and value, a checkpoint every 10 steps: the frozen base weights, the
adapter, the optimizer state, the random states, ``trainer_state.json`` and, last, a ``COMPLETE``
marker. :class:`TrainingRun` runs it on a thread of its own and hands over each checkpoint as soon
as it is complete, while training goes on. The tiering chapter tiers these checkpoints;
``link_or_copy`` is also used by the tiering benchmark.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

#: the LoRA run: optimizer steps, a checkpoint every CHECKPOINT_EVERY of them
STEPS = 50
CHECKPOINT_EVERY = 10
LORA_RANK = 8
LORA_ALPHA = 16
SEED = 7
#: written last into a checkpoint folder: the checkpoint is complete
MARKER = "COMPLETE"
#: toy training data: paraphrase pairs pulled together, the other sentences of the batch pushed apart
PAIRS = (
    ("A penguin waddles across the ice.", "The penguin walks over the ice."),
    ("Checkpoints are written every ten steps.", "Every ten steps the trainer saves a checkpoint."),
    ("The cold tier keeps every checkpoint.", "Every checkpoint is kept in cold storage."),
    ("Getting data back from an archive takes hours.", "Restores from an archive are slow."),
    ("The adapter is a few hundred kilobytes.", "The LoRA weights are small."),
    ("Two clusters hold the same model.", "The model is replicated to a second cluster."),
)
TEMPERATURE = 0.1
LEARNING_RATE = 5e-4


def checkpoint_name(step: int) -> str:
    return f"step-{step:04d}"


def link_or_copy(src: Path, dst: Path) -> None:
    """A hard link to ``src`` where the filesystem allows it, else a copy: the same bytes."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def save_checkpoint(folder: Path, base_weights: Path, model, optimizer, step: int, loss: float, history: list[dict]) -> Path:
    """Write a LoRA checkpoint folder as a trainer that saves the full model does, the
    completion marker last (a half-written folder is never taken for a checkpoint)."""
    import random

    import numpy as np
    import torch

    folder.mkdir(parents=True)
    link_or_copy(base_weights, folder / "model.safetensors")  # the frozen base, unchanged by LoRA
    model.save_pretrained(str(folder))  # adapter_model.safetensors, adapter_config.json, README.md
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
        folder / "rng_state.pth",
    )
    state = {"global_step": step, "loss": loss, "log_history": history}
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=1))
    (folder / MARKER).write_text(f"step {step}\n")
    return folder


def train_lora(
    base_folder: Path,
    run_dir: Path,
    on_checkpoint: Callable[[Path, int, float], None],
    stop: threading.Event | None = None,
) -> None:
    """LoRA-train MiniLM for ``STEPS`` AdamW steps on ``PAIRS`` (an in-batch contrastive loss on
    mean-pooled embeddings); every ``CHECKPOINT_EVERY`` steps save a checkpoint into ``run_dir``
    and call ``on_checkpoint(folder, step, loss)``. Returns early once ``stop`` is set."""
    import random

    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, AutoTokenizer

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(str(base_folder))
    config = LoraConfig(target_modules=["query", "value"], r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0)
    model = get_peft_model(AutoModel.from_pretrained(str(base_folder)), config)
    left = tokenizer([a for a, _ in PAIRS], padding=True, return_tensors="pt")
    right = tokenizer([b for _, b in PAIRS], padding=True, return_tensors="pt")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
    labels = torch.arange(len(PAIRS))

    def embed(batch):
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    model.train()
    history: list[dict] = []
    for step in range(1, STEPS + 1):
        if stop is not None and stop.is_set():
            return
        loss = torch.nn.functional.cross_entropy(embed(left) @ embed(right).T / TEMPERATURE, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append({"step": step, "loss": round(loss.item(), 6)})
        if step % CHECKPOINT_EVERY == 0:
            folder = save_checkpoint(
                run_dir / checkpoint_name(step), base_folder / "model.safetensors", model, optimizer, step, loss.item(), history
            )
            on_checkpoint(folder, step, loss.item())


class TrainingRun:
    """:func:`train_lora` on a thread of its own, as a trainer runs beside the job that tiers its
    checkpoints. ``with TrainingRun(...) as run:`` starts it; iterating yields ``(folder, step,
    loss)`` as each checkpoint is complete (and raises what the training raised); leaving the
    block stops the training at its next step."""

    def __init__(self, base_folder: Path, run_dir: Path) -> None:
        self.base_folder = base_folder
        self.run_dir = run_dir
        self._stop = threading.Event()
        self._done = object()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._train, name="lora-training", daemon=True)
        self._threads = 1

    def _train(self) -> None:
        try:
            train_lora(self.base_folder, self.run_dir, lambda *item: self._queue.put(item), self._stop)
        except BaseException as exc:  # handed to the reader, which raises it
            self._queue.put(exc)
        finally:
            self._queue.put(self._done)

    def __enter__(self) -> TrainingRun:
        import torch

        # One core for the trainer, the other for tiering: on 2 busy cores, torch's default of a
        # thread per core spends most of its time waiting for a descheduled sibling.
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[tuple[Path, int, float]]:
        while (item := self._queue.get()) is not self._done:
            if isinstance(item, BaseException):
                raise item
            yield item

    def __exit__(self, *exc) -> None:
        import torch

        self._stop.set()
        self._thread.join(timeout=60)
        torch.set_num_threads(self._threads)
