"""Errors of audits: drift configuration, replicas, model cards."""

from __future__ import annotations

from concord.errors.base import ConcordError

__all__ = [
    "DriftConfigError",
    "ModelCardError",
    "ModelCardNotFoundError",
    "ProfileError",
    "ReplicaConfigError",
]


class DriftConfigError(ConcordError, ValueError):
    """A drift audit was asked for with invalid options (thresholds, bins, columns, history, inputs).

    What is wrong with the data itself is never an error: it is a finding of the report."""

    def __init__(self, what: str, problem: str, fix: str) -> None:
        self.what = what
        self.problem = problem
        super().__init__(f"{what}: {problem}. {fix}")


class ProfileError(ConcordError, ValueError):
    """A reference profile cannot be read: not a profile, damaged, of an unknown format version,
    or inconsistent (counts that do not add up, a sample that is not sorted or not finite)."""

    exit_code = 15

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(
            f"reference profile {where}: {problem}. Make it again from its table with "
            "`concord audit profile TABLE --out FILE` (or `--store` for a data snapshot)."
        )


class ReplicaConfigError(ConcordError, ValueError):
    """A replica or model-card comparison was asked for with invalid options.

    What differs between the replicas themselves is never an error: it is a finding of the report."""

    def __init__(self, what: str, problem: str, fix: str) -> None:
        self.what = what
        self.problem = problem
        super().__init__(f"{what}: {problem}. {fix}")


class ModelCardNotFoundError(ConcordError, FileNotFoundError):
    """A snapshot holds no model card (no README.md, card.json or model_card.json at its top level)."""

    exit_code = 10

    def __init__(self, store: str, root: str) -> None:
        self.store = store
        self.root = root
        super().__init__(
            f"snapshot {root} in {store} has no model card: no README.md, card.json or model_card.json "
            "at its top level. Add a README.md with YAML front matter (license, datasets, ...) to the "
            "checkpoint folder and snapshot it again."
        )


class ModelCardError(ConcordError, ValueError):
    """A model card file cannot be read (front matter that is not YAML, a JSON card that is not an object)."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(
            f"model card {where}: {problem}. Fix the file: README.md front matter is a YAML mapping between "
            "two '---' lines at the very top; card.json and model_card.json hold one JSON object."
        )
