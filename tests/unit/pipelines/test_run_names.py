"""Task run names and artifact tables read well in the Prefect UI: a task run is named by the
cluster (or the short name) of the store it works on, never by a path or a 64-hex root, and a
label → value list has no empty table header above it."""

from __future__ import annotations

import importlib
import pkgutil
import string

import pytest
from prefect import Task

import concord_pipelines.tasks as tasks_package
from concord_pipelines.flows._report import cluster, md_facts, md_table
from concord_pipelines.tasks.common import named_by, store_name
from concord_pipelines.tasks.models import record_replica_task
from concord_pipelines.tasks.replication import replicate_task
from concord_pipelines.tasks.serving import rollback_link_task
from concord_pipelines.tasks.staging import stage_checkpoint_task

#: parameters that hold a path, a store address or a root: never put in a run name as they are
LONG = {"store", "target", "source", "dest", "root", "path", "folder", "checkpoint_dir", "out_dir", "into"}


def every_task() -> list[Task]:
    found = []
    for info in pkgutil.iter_modules(tasks_package.__path__):
        module = importlib.import_module(f"{tasks_package.__name__}.{info.name}")
        found += [v for v in vars(module).values() if isinstance(v, Task) and v.__module__ == module.__name__]
    return found


def test_no_run_name_template_puts_a_path_a_store_or_a_root_in_a_name():
    templates = {t.name: t.task_run_name for t in every_task() if isinstance(t.task_run_name, str)}
    assert templates, "no task has a run name template: the check would check nothing"
    for name, template in templates.items():
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
        assert not fields & LONG, f"task {name}: run name {template!r} puts {fields & LONG} in the UI as it is"


@pytest.mark.parametrize(
    ("task", "parameter", "value", "prefix", "short"),
    [
        (replicate_task, "target", "/srv/concord/data/stores/eu-central", "replicate-to", "eu-central"),
        (replicate_task, "target", "s3://models/stores/ap-south/", "replicate-to", "ap-south"),
        (record_replica_task, "store", "file:///srv/stores/us-east", "record-replica", "us-east"),
        (stage_checkpoint_task, "source", "s3://landing/minilm/step-400", "stage", "step-400"),
        (rollback_link_task, "dest", "/srv/serving/node-1/minilm", "rollback", "minilm"),
    ],
)
def test_store_tasks_are_named_by_the_cluster(task, parameter, value, prefix, short, monkeypatch):
    from prefect.runtime import task_run

    # what Prefect's runtime module reads a running task's parameters with
    monkeypatch.setitem(task_run.FIELDS, "parameters", lambda: {parameter: value})
    assert callable(task.task_run_name) and task.task_run_name() == f"{prefix}-{short}"
    monkeypatch.setitem(task_run.FIELDS, "parameters", dict)
    assert task.task_run_name() == prefix  # no parameter: the prefix alone


def test_a_store_reads_as_its_cluster():
    assert store_name("/a/b/data/stores/eu-central/") == cluster("data/stores/eu-central") == "eu-central"
    assert store_name("s3://bucket") == "bucket" and store_name("block:eu-central") == "block:eu-central"
    assert store_name(None) == "" and named_by("x", "y").__name__ == "x_run_name"


def test_facts_are_a_list_not_a_table_with_an_empty_header():
    text = md_facts([("size", "1.5 KiB"), ("ref", "`models/a|b`")])
    assert text == "- **size**: 1.5 KiB\n- **ref**: `models/a\\|b`"
    assert md_table(["a", "b"], [(1, None)]).splitlines() == ["| a | b |", "|---|---|", "| 1 |  |"]
