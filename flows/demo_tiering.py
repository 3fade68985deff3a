"""The demo's tiering chapter: a LoRA run's checkpoints kept hot, warm and cold.

A short LoRA run on MiniLM (rank 8 on every layer's query and value) writes a checkpoint every
10 steps, as a trainer that saves the full model does: the frozen base weights, the adapter, the
optimizer state, the random states, ``trainer_state.json`` and, last, a ``COMPLETE`` marker. The
training runs on a thread of its own; each checkpoint is handed to the tier-checkpoints flow as
soon as it is complete, while training goes on, under the policy in
``$CONCORD_HOME/tiering/policy.yaml``: hot is a local folder keeping the newest 2, warm is S3 in
STANDARD_IA keeping the newest 3, cold is S3 in GLACIER keeping all of them. S3 is a real
``moto_server`` on 127.0.0.1 (data in memory), started for the chapter and stopped at its end.

Checked: after every checkpoint, no checkpoint lacks a copy the rules demand, and each tier holds
exactly what the policy says; every tier stores the frozen base once, however many checkpoints
share it; the oldest checkpoint, left only in cold, comes back through GLACIER restore requests
byte for byte; the restore drill meets every tier's RTO and RPO.

``LocalS3``, ``aws_environment`` and ``link_or_copy`` are also used by the tiering benchmark.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

NAMESPACE = "minilm-lora"
TIERS = ("hot", "warm", "cold")
WARM_BUCKET = "concord-warm"
COLD_BUCKET = "concord-cold"
#: the LoRA run: optimizer steps, a checkpoint every CHECKPOINT_EVERY of them
STEPS = 50
CHECKPOINT_EVERY = 10
LORA_RANK = 8
LORA_ALPHA = 16
SEED = 7
MARKER = "COMPLETE"
HOT_KEEP, WARM_KEEP = 2, 3
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

AWS_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
#: whatever the shell points at must not reach the local S3 server (or send the demo to AWS)
_AWS_CLEARED = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
)


# --------------------------------------------------------------------------- a local S3 server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP status means the server is up
    except OSError:
        return False


class LocalS3:
    """S3 on this machine: a ``moto_server`` process on 127.0.0.1 and a free port, keeping its
    data in memory. ``with LocalS3(log) as s3:`` starts it, :meth:`wait` returns its endpoint once
    it answers, and the block's end stops it (its whole process group), failure or not."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = Path(log_path)
        self.port = 0
        self.endpoint = ""
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "LocalS3":
        exe = Path(sys.executable).parent / "moto_server"
        if not exe.exists():
            raise RuntimeError(
                f"{exe.name} is not installed next to {Path(sys.executable).name}: install moto's server with "
                "`pip install 'moto[server]>=5'` (the project's dev extra; `make demo` installs it)"
            )
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait(self, timeout: float = 60.0) -> str:
        """Block until the server answers on ``/moto-api/``; its endpoint URL."""
        if self._proc is None:
            raise RuntimeError("LocalS3.wait() outside its with-block: the server is not started")
        deadline = time.monotonic() + timeout
        while not _answers(f"{self.endpoint}/moto-api/"):
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self._proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not answer on {self.endpoint} within {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.1)
        return self.endpoint

    def create_buckets(self, *names: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **_boto_credentials())
        try:
            for name in names:
                client.create_bucket(Bucket=name)
        finally:
            client.close()

    def __exit__(self, *exc) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS_TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS_TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }


@contextmanager
def aws_environment(endpoint: str) -> Iterator[None]:
    """Point this process's S3 clients at ``endpoint`` with dummy credentials; put the
    environment back as it was afterwards."""
    values = {**AWS_TEST_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
    saved = {k: os.environ.get(k) for k in (*values, *_AWS_CLEARED)}
    for k in _AWS_CLEARED:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------- the LoRA run


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

    def __enter__(self) -> "TrainingRun":
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


# --------------------------------------------------------------------------- the chapter


def tiering_folders(home: Path) -> tuple[Path, ...]:
    """What the tiering chapter writes under ``home`` (S3 lives in the server's memory)."""
    return (home / "tiering",)


def write_policy(folder: Path) -> Path:
    """The chapter's tier policy, as a YAML file the reader can open."""
    text = f"""\
# The demo's tier policy: the checkpoints of its LoRA run kept hot, warm and cold (docs/tiering.md).
namespace: {NAMESPACE}
hot:                                # local disk: the newest {HOT_KEEP}, restored in seconds
  store: {json.dumps(str(folder / "hot"))}
  keep: {HOT_KEEP}
  rto: 1m
warm:                               # S3 Standard-IA: the newest {WARM_KEEP}
  store: s3://{WARM_BUCKET}/ckpt
  storage_class: STANDARD_IA
  keep: {WARM_KEEP}
  rto: 10m
cold:                               # S3 Glacier: every checkpoint; reading needs a restore first
  store: s3://{COLD_BUCKET}/ckpt
  storage_class: GLACIER
  rto: 12h
rpo: 1h                             # each tier's newest checkpoint is at most this old
gc_grace: 0s                        # a demo: collect unreferenced chunks at once
ready: {{marker: {MARKER}, settle: 0s}}   # a checkpoint is taken once its marker is written
restore: {{days: 1, tier: Expedited, timeout: 5m, poll: 0.5s}}   # S3 on this machine restores at once; AWS takes 1-5 min (Expedited)
"""
    path = folder / "policy.yaml"
    path.write_text(text)
    return path


def tiering_story(home: Path, story, base_folder: Path) -> None:
    import warnings

    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    folder = home / "tiering"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", module="peft")
        # the server starts and the model loads while the policy is written
        with LocalS3(folder / "moto_server.log") as s3, TrainingRun(base_folder, folder / "run") as training:
            _tiering(folder, story, s3, training)


def _tiering(folder: Path, story, s3: LocalS3, training: TrainingRun) -> None:
    from concord.snapshots.refs import load_manifest
    from concord.stores.base import ARCHIVED
    from concord.tiering import load_policy, stored_bytes
    from flows._report import human as _human
    from flows.demo import same_files
    from flows.tiering import restore_checkpoint_flow, restore_drill, tier_checkpoints

    story.step(f"Tier policy for a LoRA run's checkpoints, in {folder / 'policy.yaml'}; S3 for warm and cold is a moto_server")
    policy_path = write_policy(folder)
    endpoint = s3.wait()
    s3.create_buckets(WARM_BUCKET, COLD_BUCKET)
    with aws_environment(endpoint):
        policy = load_policy(str(policy_path))
        for spec in policy.tiers:
            shown = {k: v for k, v in spec.to_dict().items() if k != "store"}
            story.say(f"{spec.tier:<5} {spec.store}  {' '.join(f'{k}={v}' for k, v in shown.items())}")
        story.say(
            f"S3 endpoint {endpoint} (buckets {WARM_BUCKET}, {COLD_BUCKET}); rpo {policy.to_dict().get('rpo')}, "
            f"marker {policy.marker}"
        )
        story.check(
            policy.hot.keep == HOT_KEEP and policy.warm.keep == WARM_KEEP and policy.cold.archive and not policy.problems(),
            f"the policy passes the 3-2-1 rules: hot keeps {HOT_KEEP}, warm {WARM_KEEP}, cold (GLACIER) every checkpoint",
        )
        story.done()

        run_dir = training.run_dir
        written: list[str] = []
        last: dict = {}
        story.step(
            f"LoRA-train MiniLM (r={LORA_RANK} on query and value) for {STEPS} steps; the tier-checkpoints flow "
            "tiers each checkpoint once its COMPLETE marker is written, while training goes on"
        )

        def tier_one(path: Path, step: int, loss: float) -> None:
            name = path.name
            written.append(name)
            run = tier_checkpoints(str(policy_path), checkpoint_dir=str(path), name=name, step=step)
            status = last["status"] = run["status"]  # tier_status() as the flow read it after its sweep
            held = {t: sorted(c["name"] for c in status["checkpoints"] if c["tiers"][t]["present"]) for t in TIERS}
            want = {"hot": written[-HOT_KEEP:], "warm": written[-WARM_KEEP:], "cold": written}
            short = {t: " ".join(n[-2:] for n in held[t]) or "-" for t in held}
            story.say(f"{name}  loss {loss:.4f}  hot: {short['hot']:<6} warm: {short['warm']:<9} cold: {short['cold']}")
            for v in status["violations"]:
                story.say(f"  violation: {v}")
            story.check(
                not status["violations"] and held == {t: sorted(n) for t, n in want.items()},
                f"{name}: no copy-rule violation; hot holds the newest {min(HOT_KEEP, len(written))}, "
                f"warm the newest {min(WARM_KEEP, len(written))}, cold all {len(written)}",
            )

        for path, step, loss in training:
            tier_one(path, step, loss)
        story.done()

        story.step("Bytes each tier stores, against plain copies of the checkpoints it keeps")
        status = last["status"]
        stores = {spec.tier: spec.open() for spec in policy.tiers}
        roots = {r["name"]: r["root"] for r in status["checkpoints"]}
        size = {r["name"]: r["bytes"] for r in status["checkpoints"]}
        base_bytes = (training.base_folder / "model.safetensors").stat().st_size
        exact = True
        total_stored = total_plain = 0
        for t, store in stores.items():
            names = [r["name"] for r in status["checkpoints"] if r["tiers"][t]["present"]]
            chunks: dict[str, int] = {}
            for n in names:
                chunks.update(load_manifest(store, roots[n]).chunk_lengths())
            stored, plain = stored_bytes(store), sum(size[n] for n in names)
            exact &= stored == sum(chunks.values())
            total_stored, total_plain = total_stored + stored, total_plain + plain
            story.say(
                f"{t:<5} {len(names)} checkpoint(s): stores {_human(stored):>9}; plain copies {_human(plain):>9}  "
                f"({100 * (1 - stored / plain):.0f}% saved)"
            )
        story.say(
            f"all   {_human(total_stored)} against {_human(total_plain)} of plain copies "
            f"({100 * (1 - total_stored / total_plain):.0f}% saved); each checkpoint is {_human(size[written[-1]])}, "
            f"{_human(base_bytes)} of it the frozen base"
        )
        claim = "every tier stores exactly the chunks of the checkpoints it keeps, each once: the frozen base once per tier"
        story.check(exact, claim)
        story.done()

        oldest = written[0]
        story.step(f"Restore {oldest}, now only in cold (GLACIER): restore requests, wait, then read back")
        cold = stores["cold"]
        ids = list(load_manifest(cold, roots[oldest]).chunk_lengths())
        states = cold.chunk_states(ids)
        story.say(f"{len(ids)} chunks in cold; states before: {_counts(states)}")
        out = folder / "restored" / oldest
        shutil.rmtree(out, ignore_errors=True)
        r = restore_checkpoint_flow(str(policy_path), oldest, str(out), tier="cold")
        story.say(
            f"from {r['tier']} ({r['store']}): {r['restore_requests']} restore requests, waited {r['wait_seconds']:.1f} s; "
            f"{r['files']} files, {_human(r['bytes'])} in {r['seconds']:.1f} s"
        )
        story.check(
            all(s == ARCHIVED for s in states.values()) and r["tier"] == "cold" and r["restore_requests"] == len(ids),
            f"the chunks were archived, and one GLACIER restore request per chunk ({len(ids)}) brought them back",
        )
        n, differ = same_files(run_dir / oldest, out)
        claim = f"all {n} files of {oldest} are byte-identical to the checkpoint written"
        story.check(n == r["files"] and not differ, claim + (f" (differ: {differ})" if differ else ""))
        story.done()

        story.step("Restore drill: restore a checkpoint from every tier, measure RTO and RPO against the policy")
        d = restore_drill(str(policy_path), sample=1)
        rows = {t: d["tiers"].get(t) or {} for t in TIERS}
        for t, row in rows.items():
            story.say(
                f"{t:<5} RTO {_secs(row.get('rto_seconds'))} (objective {_secs(row.get('rto_objective'))})  "
                f"RPO {_secs(row.get('rpo_seconds'))} (objective {_secs(row.get('rpo_objective'))})  "
                + ("ok" if row.get("ok") else "MISSED")
            )
        for f in d.get("findings") or []:
            story.say(f"finding: {f}")
        story.check(d["ok"] and all(row.get("ok") for row in rows.values()), "the drill meets every tier's RTO and RPO")
        story.done()
        for store in stores.values():
            store.close()


def _counts(states: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s] = counts.get(s, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 3600:
        return f"{x / 3600:g} h"
    if x >= 60:
        return f"{x / 60:g} min"
    return f"{x:.1f} s" if x < 10 else f"{x:.0f} s"
